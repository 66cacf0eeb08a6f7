// The checkpoint module in one include: save (writer.hpp), validated open and resharding reads
// (reader.hpp), slice math (layout.hpp), the manifest (manifest.hpp), drills (drill.hpp), the
// one-writer lock of a directory (lock.hpp).
#pragma once

#include "checkpoint/drill.hpp"
#include "checkpoint/errors.hpp"
#include "checkpoint/layout.hpp"
#include "checkpoint/lock.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/reader.hpp"
#include "checkpoint/shard_file.hpp"
#include "checkpoint/writer.hpp"
