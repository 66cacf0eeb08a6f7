// Mapping of Hugging Face config.json files and torchtitan Llama model arguments onto the
// scenario's "model" block (harness/model_import.hpp). The scenario model (reference/README.md)
// fixes RMSNorm eps 1e-5, no biases, no sliding window, per-document causal masking: an input that
// differs there is reported, never dropped silently. Its RoPE (model.rope) takes the input's theta
// and Llama 3.1's "llama3" scaling; any other scaling is refused.
#include "harness/model_import.hpp"

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

#include "comm/text.hpp"
#include "harness/json_reader.hpp"
#include "harness/scenario.hpp"

namespace shardcheck::harness {

// Named so that a unity build (CI's sanitizer batches) merging this file with others' anonymous
// helpers (num, kBig, ...) sees no two definitions of one name.
namespace import_detail {

constexpr int kBig = 1 << 30;  // the scenario loader's bound on sizes

// What the scenario model fixes (reference/README.md "Forward, one sequence").
constexpr double kModelNormEps = 1e-5;
// The scenario loader's bounds on model.rope.theta (harness/scenario.cpp).
constexpr double kMinRopeTheta = 1.0 + 1e-9;
constexpr double kMaxRopeTheta = 1e12;

std::string num(long long v) {
  return std::to_string(v);
}

std::string range(long long min, long long max) {
  return "[" + num(min) + ", " + num(max) + "]";
}

// One object of the input (the whole file, "$", or one nested in it, "$.rope_scaling"): typed
// getters naming the JSON path, and the keys no getter read.
class Fields {
 public:
  explicit Fields(const nlohmann::json& j, std::string path = "$")
      : j_(j), path_(std::move(path)) {}

  std::string at(const std::string& key) const { return path_ + "." + comm::printable(key); }
  // Present and not null; marks the key as read.
  bool given(const std::string& key) {
    const nlohmann::json* v = get(key);
    return v && !v->is_null();
  }
  const nlohmann::json* get(const std::string& key) {
    read_.insert(key);
    const auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  // An integer in [min, max]; absent or null: nullopt.
  std::optional<long long> integer(const std::string& key, long long min, long long max) {
    const nlohmann::json* v = get(key);
    if (!v || v->is_null()) return std::nullopt;
    // Integers are JSON integers (4096.0 is refused, as in scenarios).
    if (!v->is_number_integer() || v->get<long long>() < min || v->get<long long>() > max)
      throw ScenarioError(
          at(key), "expected an integer in " + range(min, max) + ", got " + describe_json(*v));
    return v->get<long long>();
  }
  int required(const std::string& key, long long min, long long max) {
    const nlohmann::json* v = get(key);
    if (!v || v->is_null())
      throw ScenarioError(at(key), std::string(v ? "null" : "missing") +
                                       "; expected an integer in " + range(min, max));
    return static_cast<int>(*integer(key, min, max));
  }
  std::optional<double> number(const std::string& key, double min, double max) {
    const nlohmann::json* v = get(key);
    if (!v || v->is_null()) return std::nullopt;
    if (!v->is_number() || !(v->get<double>() >= min && v->get<double>() <= max)) {
      std::ostringstream os;
      os << "expected a number in [" << min << ", " << max << "], got " << describe_json(*v);
      throw ScenarioError(at(key), os.str());
    }
    return v->get<double>();
  }
  std::optional<bool> boolean(const std::string& key) {
    const nlohmann::json* v = get(key);
    if (!v || v->is_null()) return std::nullopt;
    if (!v->is_boolean())
      throw ScenarioError(at(key), "expected true or false, got " + describe_json(*v));
    return v->get<bool>();
  }
  std::optional<std::string> text(const std::string& key) {
    const nlohmann::json* v = get(key);
    if (!v || v->is_null()) return std::nullopt;
    if (!v->is_string())
      throw ScenarioError(at(key), "expected a string, got " + describe_json(*v));
    return v->get<std::string>();
  }
  // Keys of the object no getter read, in the input's (sorted) order.
  std::vector<std::string> unread() const {
    std::vector<std::string> out;
    for (const auto& [k, v] : j_.items())
      if (!read_.count(k)) out.push_back(k);
    return out;
  }

 private:
  const nlohmann::json& j_;
  std::string path_;
  std::set<std::string> read_;
};

// A value in a note: whole up to a few lines' worth (describe_json cuts at 60 characters, too
// short for a rope_scaling object), cut beyond so that hostile input cannot flood stderr.
std::string whole(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 400) s = s.substr(0, 397) + "...";
  return s;
}

std::string show(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// RoPE as the scenario model has it (model.rope, reference/config.hpp RopeConfig): theta, the
// layout of the rotated pairs, and Llama 3.1's scaling ("llama3") or none.
struct Llama3Scaling {
  double factor = 8.0;  // the published Llama 3.1 values, torchtitan's and Meta's defaults
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  long long original_max_positions = 8192;
  bool operator==(const Llama3Scaling&) const = default;
};

nlohmann::ordered_json rope_block(double theta, const char* layout,
                                  const std::optional<Llama3Scaling>& s) {
  nlohmann::ordered_json r;
  r["theta"] = theta;
  r["layout"] = layout;
  r["scaling"] = nullptr;
  if (s) {
    nlohmann::ordered_json sc;
    sc["rope_type"] = "llama3";
    sc["factor"] = s->factor;
    sc["low_freq_factor"] = s->low_freq_factor;
    sc["high_freq_factor"] = s->high_freq_factor;
    sc["original_max_position_embeddings"] = s->original_max_positions;
    r["scaling"] = sc;
  }
  return r;
}

// The RoPE base: a number > 1 (the scenario loader's bounds); absent or null: nullopt.
std::optional<double> rope_theta(Fields& f, const std::string& key) {
  const nlohmann::json* v = f.get(key);
  if (!v || v->is_null()) return std::nullopt;
  if (!v->is_number() || !(v->get<double>() >= kMinRopeTheta && v->get<double>() <= kMaxRopeTheta))
    throw ScenarioError(f.at(key), "expected a number > 1 and at most 1e12 (the RoPE base), got " +
                                       describe_json(*v));
  return v->get<double>();
}

// Llama 3.1's scaling from an object of the input: Hugging Face's rope_scaling (factor, all four
// required, as transformers' llama3 rope) or torchtitan's rope_scaling_args (scaling_factor; an
// absent field is RoPEScalingArgs' default, noted).
Llama3Scaling llama3_scaling(Fields& s, const char* factor_key, bool required, ModelImport& m) {
  Llama3Scaling out;
  const auto missing = [&](const char* key, const std::string& value) {
    if (required)
      throw ScenarioError(s.at(key), std::string("missing; rope_type \"llama3\" needs ") +
                                         factor_key +
                                         ", low_freq_factor, high_freq_factor and "
                                         "original_max_position_embeddings");
    m.defaults.push_back(s.at(key) + " absent: " + value + ", as torchtitan's RoPEScalingArgs");
  };
  if (const auto v = s.number(factor_key, 1.0, 1e6))
    out.factor = *v;
  else
    missing(factor_key, show(out.factor));
  if (const auto v = s.number("low_freq_factor", 1e-6, 1e6))
    out.low_freq_factor = *v;
  else
    missing("low_freq_factor", show(out.low_freq_factor));
  if (const auto v = s.number("high_freq_factor", 1e-6, 1e6))
    out.high_freq_factor = *v;
  else
    missing("high_freq_factor", show(out.high_freq_factor));
  if (out.high_freq_factor <= out.low_freq_factor)
    throw ScenarioError(s.at("high_freq_factor"),
                        "expected a number greater than low_freq_factor (" +
                            show(out.low_freq_factor) + "), got " + show(out.high_freq_factor));
  if (const auto v = s.integer("original_max_position_embeddings", 1, kBig))
    out.original_max_positions = *v;
  else
    missing("original_max_position_embeddings", num(out.original_max_positions));
  return out;
}

// Hugging Face's rope_scaling (transformers 4) or rope_parameters (transformers 5, rope_theta
// inside): rope_type (or the older "type") "llama3" is mapped, "default" is no scaling, any other
// (linear, dynamic, yarn, longrope, ...) is refused: the scenario model has no other scaling, and
// dropping one would change every rotation angle it touches.
struct HfRope {
  std::optional<double> theta;
  std::optional<Llama3Scaling> scaling;
};

HfRope hf_rope(const nlohmann::json& v, const std::string& path, bool with_theta, ModelImport& m) {
  if (!v.is_object())
    throw ScenarioError(path,
                        "expected an object (rope_type \"llama3\" or \"default\") or null, got " +
                            describe_json(v));
  Fields s(v, path);
  HfRope r;
  if (with_theta) r.theta = rope_theta(s, "rope_theta");
  const std::optional<std::string> type = s.text("rope_type");
  const std::optional<std::string> legacy = s.text("type");
  if (type && legacy && *type != *legacy)
    throw ScenarioError(s.at("type"), describe_json(*legacy) + " differs from rope_type " +
                                          describe_json(*type) + "; give one");
  const char* supported =
      "\"llama3\" (Llama 3.1's scaling: the scenario's model.rope.scaling) or \"default\" (none)";
  if (!type && !legacy)
    throw ScenarioError(s.at("rope_type"), std::string("missing; expected ") + supported);
  const std::string t = type ? *type : *legacy;
  if (t == "llama3") {
    r.scaling = llama3_scaling(s, "factor", true, m);
  } else if (t != "default") {
    throw ScenarioError(s.at(type ? "rope_type" : "type"),
                        std::string("expected ") + supported + ", got " + describe_json(t) +
                            "; the scenario model has no other RoPE scaling, and leaving it out "
                            "would change the rotation angles");
  }
  for (const std::string& k : s.unread()) m.not_recognised.push_back(s.at(k));
  return r;
}

// The shape checks of the reference (reference/config.cpp) with the input's own key names, so the
// message names the field of the config file to look at.
struct ShapeKeys {
  const char* hidden;
  const char* heads;
  const char* kv_heads;
};

void check_shape(int hidden, int heads, int kv_heads, const ShapeKeys& k) {
  if (hidden % heads != 0)
    throw ScenarioError(std::string("$.") + k.heads,
                        num(heads) + " does not divide " + k.hidden + " (" + num(hidden) +
                            "); the scenario model's head dim is hidden / heads");
  if ((hidden / heads) % 2 != 0)
    throw ScenarioError(std::string("$.") + k.hidden,
                        "the head dim " + std::string(k.hidden) + " / " + k.heads + " = " +
                            num(hidden / heads) + " is odd; RoPE needs an even head dim");
  if (heads % kv_heads != 0)
    throw ScenarioError(std::string("$.") + k.kv_heads,
                        num(kv_heads) + " does not divide " + k.heads + " (" + num(heads) + ")");
}

// Hugging Face config.json.
enum class Arch { kLlama, kMistral, kMixtral, kQwen2 };

struct ArchInfo {
  Arch arch;
  const char* name;        // architectures[0]
  const char* model_type;  // model_type
  const char* config;      // transformers' config class
};

constexpr ArchInfo kArchs[] = {
    {Arch::kLlama, "LlamaForCausalLM", "llama", "LlamaConfig"},
    {Arch::kMistral, "MistralForCausalLM", "mistral", "MistralConfig"},
    {Arch::kMixtral, "MixtralForCausalLM", "mixtral", "MixtralConfig"},
    {Arch::kQwen2, "Qwen2ForCausalLM", "qwen2", "Qwen2Config"},
};

std::string arch_list(bool model_types) {
  std::string s;
  for (const ArchInfo& a : kArchs)
    s += (s.empty() ? "" : ", ") + std::string("\"") + (model_types ? a.model_type : a.name) + "\"";
  return s;
}

// Keys that never change the model's math: token ids, storage dtype, versions, inference flags.
const std::set<std::string>& hf_metadata() {
  static const std::set<std::string> k = {"_name_or_path",
                                          "bos_token_id",
                                          "eos_token_id",
                                          "pad_token_id",
                                          "torch_dtype",
                                          "dtype",
                                          "transformers_version",
                                          "use_cache",
                                          "output_attentions",
                                          "output_hidden_states",
                                          "return_dict",
                                          "tokenizer_class",
                                          "is_decoder",
                                          "_attn_implementation",
                                          "auto_map",
                                          "keys_to_ignore_at_inference"};
  return k;
}

ModelImport import_hf(const nlohmann::json& j, Fields& f) {
  ModelImport m;
  // The architecture: architectures[0], or model_type alone.
  const ArchInfo* arch = nullptr;
  if (const nlohmann::json* a = f.get("architectures"); a && !a->is_null()) {
    if (!a->is_array() || a->size() != 1)
      throw ScenarioError("$.architectures", "expected an array of one architecture (one of " +
                                                 arch_list(false) + "), got " + describe_json(*a));
    const nlohmann::json& name = (*a)[0];
    for (const ArchInfo& x : kArchs)
      if (name.is_string() && name.get<std::string>() == x.name) arch = &x;
    if (!arch)
      throw ScenarioError("$.architectures[0]",
                          "expected one of " + arch_list(false) + ", got " + describe_json(name));
  }
  if (const std::optional<std::string> type = f.text("model_type")) {
    const ArchInfo* by_type = nullptr;
    for (const ArchInfo& x : kArchs)
      if (*type == x.model_type) by_type = &x;
    if (!by_type)
      throw ScenarioError("$.model_type", "expected one of " + arch_list(true) + ", got " +
                                              describe_json(j.at("model_type")));
    if (arch && arch != by_type)
      throw ScenarioError("$.model_type", "expected \"" + std::string(arch->model_type) +
                                              "\" for " + arch->name + ", got " +
                                              describe_json(j.at("model_type")));
    arch = by_type;
  }
  if (!arch) throw ScenarioError("$.architectures", "missing; expected one of " + arch_list(false));
  m.source = std::string("Hugging Face ") + arch->name;
  const std::string cls = std::string("transformers' ") + arch->config;

  if (const auto act = f.text("hidden_act")) {
    if (*act != "silu")
      throw ScenarioError("$.hidden_act",
                          "expected \"silu\", got " + describe_json(j.at("hidden_act")) +
                              " (the scenario's gated MLP, \"swiglu\", is SiLU-gated)");
  } else if (f.get("hidden_act")) {
    throw ScenarioError("$.hidden_act", "expected \"silu\", got null");
  } else {
    m.defaults.push_back("$.hidden_act absent: \"silu\", as " + cls);
  }
  const int vocab = f.required("vocab_size", 3, kBig);
  const int hidden = f.required("hidden_size", 1, kBig);
  const int layers = f.required("num_hidden_layers", 1, 100000);
  const int heads = f.required("num_attention_heads", 1, 100000);
  int kv_heads = heads;
  if (const auto kv = f.integer("num_key_value_heads", 1, 100000)) {
    kv_heads = static_cast<int>(*kv);
  } else {
    // The config classes differ: Llama's None means multi-head attention, the others default to
    // a number.
    kv_heads = arch->arch == Arch::kLlama ? heads : arch->arch == Arch::kQwen2 ? 32 : 8;
    m.defaults.push_back("$.num_key_value_heads absent: " + num(kv_heads) + ", as " + cls);
  }
  const int ffn = f.required("intermediate_size", 1, kBig);
  check_shape(hidden, heads, kv_heads,
              {"hidden_size", "num_attention_heads", "num_key_value_heads"});
  if (const auto head_dim = f.integer("head_dim", 1, kBig); head_dim && *head_dim != hidden / heads)
    throw ScenarioError("$.head_dim", num(*head_dim) + " differs from hidden_size / " +
                                          "num_attention_heads (" + num(hidden / heads) +
                                          "); the scenario model's head dim is hidden / heads");
  std::optional<long long> seq_len = f.integer("max_position_embeddings", 2, kBig);
  bool tie = false;
  if (const auto t = f.boolean("tie_word_embeddings"))
    tie = *t;
  else
    m.defaults.push_back("$.tie_word_embeddings absent: false, as " + cls);
  const std::optional<double> dropout = f.number("attention_dropout", 0.0, 0.99);

  // What the scenario model fixes, checked.
  const auto fixed = [&](const char* key, double model, const char* what) {
    if (const auto v = f.number(key, 0.0, 1e300); v && *v != model)
      m.not_mapped.push_back(std::string("$.") + key + ": " + show(*v) + " (the scenario model's " +
                             what + " " + show(model) + ")");
  };
  fixed("rms_norm_eps", kModelNormEps, "RMSNorm uses eps");

  // RoPE: rope_theta and rope_scaling (transformers 4), or rope_parameters (transformers 5); both
  // given must agree. Layout "half": transformers rotates (j, j + d/2) with rotate_half, and the
  // published checkpoints (Meta's and Mistral's converted with q and k permuted) are stored for it.
  std::optional<double> theta = rope_theta(f, "rope_theta");
  std::optional<Llama3Scaling> scaling;
  const nlohmann::json* legacy_scaling = f.get("rope_scaling");
  if (legacy_scaling && !legacy_scaling->is_null())
    scaling = hf_rope(*legacy_scaling, "$.rope_scaling", false, m).scaling;
  if (const nlohmann::json* p = f.get("rope_parameters"); p && !p->is_null()) {
    const HfRope v5 = hf_rope(*p, "$.rope_parameters", true, m);
    if (theta && v5.theta && *theta != *v5.theta)
      throw ScenarioError("$.rope_theta", show(*theta) +
                                              " differs from $.rope_parameters.rope_theta (" +
                                              show(*v5.theta) + "); give one");
    if (legacy_scaling && !legacy_scaling->is_null() && scaling != v5.scaling)
      throw ScenarioError("$.rope_scaling", "differs from $.rope_parameters; give one");
    if (v5.theta) theta = v5.theta;
    scaling = v5.scaling;
  }
  if (!theta) {
    theta = arch->arch == Arch::kMixtral ? 1e6 : 1e4;
    m.defaults.push_back("$.rope_theta absent: " + show(*theta) + ", as " + cls);
  }
  if (f.boolean("attention_bias").value_or(false))
    m.not_mapped.push_back(
        "$.attention_bias: true (biases on the q, k, v and o projections; the scenario model has "
        "none)");
  if (f.boolean("mlp_bias").value_or(false))
    m.not_mapped.push_back(
        "$.mlp_bias: true (biases on the MLP projections; the scenario model has none)");
  if (arch->arch == Arch::kQwen2)
    m.not_mapped.push_back(
        "$.architectures[0]: Qwen2ForCausalLM (biases on the q, k and v projections, fixed by the "
        "architecture, no config key; the scenario model has none)");
  if (const auto tp = f.integer("pretraining_tp", 1, kBig); tp && *tp > 1)
    m.not_mapped.push_back("$.pretraining_tp: " + num(*tp) +
                           " (each projection computed as that many slices summed: the same "
                           "product up to rounding)");
  if (const auto init = f.number("initializer_range", 0.0, 1e300))
    m.not_mapped.push_back("$.initializer_range: " + show(*init) +
                           " (initialisation; the scenario model initialises as "
                           "reference/README.md)");
  // Sliding-window attention: always on in Mistral and Mixtral when sliding_window is set; in
  // Qwen2 only with use_sliding_window, on the layers from max_window_layers on.
  const bool qwen2 = arch->arch == Arch::kQwen2;
  const bool window_on = qwen2 ? f.boolean("use_sliding_window").value_or(false) : true;
  if (arch->arch != Arch::kLlama) {
    const std::optional<long long> window = f.integer("sliding_window", 1, kBig);
    std::optional<long long> from;
    if (qwen2) from = f.integer("max_window_layers", 0, kBig);
    if (window && window_on)
      m.not_mapped.push_back(
          "$.sliding_window: " + num(*window) + " (attention to the last " + num(*window) +
          " tokens only" +
          (qwen2 ? ", on layers from max_window_layers (" + (from ? num(*from) : "absent") + ")"
                 : std::string()) +
          "; the scenario model attends to every earlier token of the document)");
    else if (window || from)
      m.ignored.push_back(std::string(window ? "$.sliding_window" : "") +
                          (window && from ? ", " : "") + (from ? "$.max_window_layers" : "") +
                          " (inactive: use_sliding_window is false)");
  }
  if (const nlohmann::json* types = f.get("layer_types"); types && !types->is_null()) {
    bool full = types->is_array();
    if (full)
      for (const auto& t : *types) full = full && t == "full_attention";
    if (!full)
      m.not_mapped.push_back("$.layer_types: " + whole(*types) +
                             " (the scenario model has full causal attention on every layer)");
  }

  nlohmann::ordered_json b;
  b["vocab"] = vocab;
  b["hidden"] = hidden;
  b["layers"] = layers;
  b["heads"] = heads;
  b["kv_heads"] = kv_heads;
  b["ffn"] = ffn;
  b["mlp"] = "swiglu";
  if (seq_len) b["seq_len"] = *seq_len;
  b["tie_embeddings"] = tie;
  if (dropout) b["dropout"] = *dropout;
  b["rope"] = rope_block(*theta, "half", scaling);
  if (arch->arch == Arch::kMixtral) {
    const int experts = f.required("num_local_experts", 1, 100000);
    const int top_k = f.required("num_experts_per_tok", 1, experts);
    double aux = 0.001;
    if (const auto a = f.number("router_aux_loss_coef", 0.0, 1e6))
      aux = *a;
    else
      m.defaults.push_back("$.router_aux_loss_coef absent: 0.001, as " + cls);
    if (!f.boolean("output_router_logits").value_or(false))
      m.not_mapped.push_back(
          "$.output_router_logits: false or absent (transformers adds the router's aux loss only "
          "when it is true; moe.aux_loss is router_aux_loss_coef, as a training run sets it)");
    if (const auto jitter = f.number("router_jitter_noise", 0.0, 1e300); jitter && *jitter > 0)
      m.not_mapped.push_back("$.router_jitter_noise: " + show(*jitter) +
                             " (the scenario model's router has no noise)");
    // Mixtral drops no token: every expert can take every token of the sequence when the
    // capacity ceil(cf * S * k / E) reaches S, i.e. cf = E / k.
    const double capacity = static_cast<double>(experts) / top_k;
    m.not_mapped.push_back(
        "$.num_local_experts: Mixtral routes without capacity; moe.capacity_factor = experts / "
        "top_k = " +
        show(capacity) +
        " gives every expert room for every token, so none is dropped (the scenario model's aux "
        "loss is per sequence, transformers' over the batch)");
    nlohmann::ordered_json moe;
    moe["experts"] = experts;
    moe["top_k"] = top_k;
    moe["capacity_factor"] = capacity;
    moe["every"] = 1;
    moe["aux_loss"] = aux;
    b["moe"] = moe;
  }
  m.model = b;
  for (const std::string& k : f.unread())
    (hf_metadata().count(k) ? m.ignored : m.not_recognised).push_back(f.at(k));
  return m;
}

// torchtitan's Llama model arguments (torchtitan/models/llama3/model/args.py): ffn from dim,
// ffn_dim_multiplier and multiple_of as FeedForward computes it.
ModelImport import_torchtitan(Fields& f) {
  ModelImport m;
  m.source = "torchtitan Llama model args";
  for (const char* moe : {"moe_enabled", "moe_args", "num_experts", "moe_inter_dim"})
    if (f.given(moe))
      throw ScenarioError(std::string("$.") + moe,
                          "torchtitan MoE arguments (Llama 4, DeepSeek) are not imported; give a "
                          "dense Llama's arguments, or a Hugging Face MixtralForCausalLM config");
  const int dim = f.required("dim", 1, kBig);
  const int layers = f.required("n_layers", 1, 100000);
  const int heads = f.required("n_heads", 1, 100000);
  int kv_heads = heads;
  if (const auto kv = f.integer("n_kv_heads", 1, 100000))
    kv_heads = static_cast<int>(*kv);
  else
    m.defaults.push_back("$.n_kv_heads absent or null: n_heads (" + num(heads) +
                         "), as torchtitan");
  const nlohmann::json* v = f.get("vocab_size");
  if (!v || !v->is_number_integer() || v->get<long long>() < 3 || v->get<long long>() > kBig)
    throw ScenarioError(
        "$.vocab_size",
        std::string(v ? "expected an integer in " + range(3, kBig) + ", got " + describe_json(*v)
                      : "missing; expected an integer in " + range(3, kBig)) +
            " (torchtitan sets it from the tokenizer: give the tokenizer's vocabulary size)");
  const int vocab = static_cast<int>(v->get<long long>());
  check_shape(dim, heads, kv_heads, {"dim", "n_heads", "n_kv_heads"});
  long long multiple_of = 256;
  if (const auto mo = f.integer("multiple_of", 1, kBig))
    multiple_of = *mo;
  else
    m.defaults.push_back("$.multiple_of absent: 256, as torchtitan");
  // hidden = int(2 * (4 * dim) / 3); hidden = int(ffn_dim_multiplier * hidden);
  // hidden = multiple_of * ((hidden + multiple_of - 1) // multiple_of). Python's floats are
  // doubles, so the same arithmetic here gives its result.
  long long ffn = static_cast<long long>(2.0 * (4.0 * dim) / 3.0);
  if (const auto mult = f.number("ffn_dim_multiplier", 1e-6, 1e6))
    ffn = static_cast<long long>(*mult * static_cast<double>(ffn));
  ffn = multiple_of * ((ffn + multiple_of - 1) / multiple_of);
  if (ffn < 1 || ffn > kBig)
    throw ScenarioError("$.ffn_dim_multiplier", "gives an MLP width of " + num(ffn) +
                                                    "; expected one in " + range(1, kBig));
  const std::optional<long long> seq_len = f.integer("max_seq_len", 2, kBig);
  if (const auto eps = f.number("norm_eps", 0.0, 1e300); eps && *eps != kModelNormEps)
    m.not_mapped.push_back("$.norm_eps: " + show(*eps) +
                           " (the scenario model's RMSNorm uses eps 1e-05)");
  // RoPE: torchtitan's (and Meta's) code rotates adjacent pairs, layout "interleaved". Scaling:
  // rope_scaling_args (torchtitan since pytorch/torchtitan#1839, October 2025, applied to every
  // Llama 3), or use_scaled_rope (Meta's params.json: apply_scaling's fixed 8, 1, 4, 8192).
  double theta = 10000.0;
  if (const auto t = rope_theta(f, "rope_theta"))
    theta = *t;
  else
    m.defaults.push_back("$.rope_theta absent: 10000, as torchtitan's TransformerModelArgs");
  std::optional<Llama3Scaling> scaling;
  const nlohmann::json* args = f.get("rope_scaling_args");
  const std::optional<bool> meta_scaled = f.boolean("use_scaled_rope");
  if (args && meta_scaled)
    throw ScenarioError("$.use_scaled_rope",
                        "given with $.rope_scaling_args; give one (use_scaled_rope is Meta's "
                        "params.json, rope_scaling_args torchtitan's model args)");
  if (meta_scaled) {
    if (*meta_scaled) scaling = Llama3Scaling{};
  } else if (!args) {
    scaling = Llama3Scaling{};
    m.defaults.push_back(
        "$.rope_scaling_args absent: llama3 scaling (scaling_factor 8, low_freq_factor 1, "
        "high_freq_factor 4, original_max_position_embeddings 8192), as torchtitan's "
        "TransformerModelArgs since pytorch/torchtitan#1839 (October 2025); torchtitan before it, "
        "and Meta's params.json without use_scaled_rope, have none: give \"rope_scaling_args\": "
        "null for that");
  } else if (!args->is_null()) {
    if (!args->is_object())
      throw ScenarioError("$.rope_scaling_args",
                          "expected an object (scaling_factor, low_freq_factor, high_freq_factor, "
                          "original_max_position_embeddings) or null (no scaling), got " +
                              describe_json(*args));
    Fields s(*args, "$.rope_scaling_args");
    scaling = llama3_scaling(s, "scaling_factor", false, m);
    for (const std::string& k : s.unread()) m.not_recognised.push_back(s.at(k));
  }
  if (const auto norm = f.text("norm_type"); norm && *norm != "rmsnorm" && *norm != "fused_rmsnorm")
    throw ScenarioError("$.norm_type", "expected \"rmsnorm\" (or \"fused_rmsnorm\"), got " +
                                           describe_json(nlohmann::json(*norm)));
  if (const auto mask = f.text("attn_mask_type"); mask && *mask != "block_causal") {
    if (*mask != "causal")
      throw ScenarioError("$.attn_mask_type", "expected \"causal\" or \"block_causal\", got " +
                                                  describe_json(nlohmann::json(*mask)));
    m.not_mapped.push_back(
        "$.attn_mask_type: \"causal\" (attends across document boundaries of a packed sequence; "
        "the scenario model masks each document, as \"block_causal\")");
  }
  if (f.boolean("depth_init").value_or(false))
    m.not_mapped.push_back(
        "$.depth_init: true (initialisation std by layer depth; the scenario model initialises as "
        "reference/README.md)");
  for (const char* meta : {"use_flex_attn", "attn_type", "eos_id", "use_grouped_mm"})
    if (f.get(meta)) m.ignored.push_back(std::string("$.") + meta);

  nlohmann::ordered_json b;
  b["vocab"] = vocab;
  b["hidden"] = dim;
  b["layers"] = layers;
  b["heads"] = heads;
  b["kv_heads"] = kv_heads;
  b["ffn"] = ffn;
  b["mlp"] = "swiglu";
  if (seq_len) b["seq_len"] = *seq_len;
  b["tie_embeddings"] = false;  // torchtitan's Llama has its own output projection
  b["rope"] = rope_block(theta, "interleaved", scaling);
  m.model = b;
  for (const std::string& k : f.unread()) m.not_recognised.push_back(f.at(k));
  return m;
}

}  // namespace import_detail

ModelImport import_model(const nlohmann::json& config) {
  if (!config.is_object())
    throw ScenarioError("$",
                        "expected a JSON object (a config.json or torchtitan model args), "
                        "got " +
                            describe_json(config));
  import_detail::Fields f(config);
  const bool hf = (config.contains("architectures") && !config.at("architectures").is_null()) ||
                  config.contains("model_type");
  if (!hf && !config.contains("dim"))
    throw ScenarioError("$",
                        "neither a Hugging Face config.json (no \"architectures\" or "
                        "\"model_type\") nor torchtitan Llama model args (no \"dim\")");
  ModelImport m = hf ? import_detail::import_hf(config, f) : import_detail::import_torchtitan(f);
  // The block must load as a scenario's model (the loader's own rules, reference/config.cpp).
  try {
    parse_scenario(nlohmann::json{{"name", "import-model"}, {"model", nlohmann::json(m.model)}});
  } catch (const ScenarioError& e) {
    throw ScenarioError(
        "$", std::string("the mapped block is refused by the scenario loader: ") + e.what());
  }
  return m;
}

namespace {
const JsonInput kConfigInput{.file = "the model configuration", .noun = "a model configuration"};
}  // namespace

ModelImport import_model_text(std::string_view text, const std::string& origin_name) {
  const std::string origin = comm::printable(origin_name);
  const nlohmann::json j = parse_input_json(text, origin, kConfigInput);
  try {
    return import_model(j);
  } catch (const ScenarioError& e) {
    throw ScenarioError(origin + ": " + e.path(),
                        std::string(e.what()).substr(e.path().size() + 2));
  }
}

ModelImport load_model_config(const std::string& file) {
  return import_model_text(read_input_file(file, kConfigInput), file);
}

std::string import_note(const ModelImport& m) {
  const std::string p = "shardcheck import-model: ";
  const bool half = m.model.contains("rope") && m.model.at("rope").value("layout", "") == "half";
  std::string s = p + m.source + " -> scenario model (mlp \"swiglu\", rope layout " +
                  (half ? "\"half\": rotate_half, as Hugging Face's checkpoints are stored"
                        : "\"interleaved\": adjacent pairs, as Meta's and torchtitan's code") +
                  ")\n";
  const auto lines = [&](const std::vector<std::string>& v, const std::string& head) {
    if (v.empty()) return;
    s += p + head + ":\n";
    for (const std::string& x : v) s += "  " + x + "\n";
  };
  const auto list = [&](const std::vector<std::string>& v, const std::string& head) {
    if (v.empty()) return;
    s += p + head + ": ";
    for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
    s += "\n";
  };
  lines(m.not_mapped,
        "not mapped (the scenario model cannot express these; its math differs where they apply)");
  lines(m.defaults, "absent, the architecture's default used");
  list(m.not_recognised, "not recognised (check whether they change the model)");
  list(m.ignored, "ignored (no effect on the model's math)");
  return s;
}

}  // namespace shardcheck::harness
