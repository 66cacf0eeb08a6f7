// What the CLI and its manifests say about the code that wrote them: the project version and the
// git commit it was configured from ("unknown" outside a git tree). Generated at configure time
// (build_info.cpp.in), so a new commit rebuilds one file.
#pragma once

namespace shardcheck::harness {

const char* code_version();  // "0.1.0"
const char* code_commit();   // 40 hex digits, or "unknown"

}  // namespace shardcheck::harness
