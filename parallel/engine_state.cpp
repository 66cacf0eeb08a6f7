// Full parameters, checkpoint state export/import and resident sizes of the engine (engine.hpp).
// Export writes each element of each logical tensor once over all ranks; import reads only the
// ranges this engine's own layout holds, whatever layout exported them.
#include <cstring>

#include "parallel/engine.hpp"
#include "reference/bf16.hpp"

namespace shardcheck::parallel {

template <class T>
ref::ParamMap<double> EngineImpl<T>::full_params() {
  ref::ParamMap<T> out = layout.template zeros<T>();
  for (Group<T>& g : groups_) {
    std::vector<T> full(g.layout.padded_numel(), T{0});
    const std::span<T> master = master_of(g);
    std::copy(master.begin(), master.end(),
              full.begin() + static_cast<std::ptrdiff_t>(g.owned.begin));
    if (g.owned.size() != g.layout.numel())
      (g.sharded ? *shard_ : dp_).all_gather(comm::view(std::span<T>(full)))->wait();
    g.layout.unpack(std::span<const T>(full), out);
  }
  return out.template cast<double>();
}

template <class T>
Range EngineImpl<T>::write_range(const Group<T>& g, bool replicated) const {
  const std::size_t n = g.layout.numel();
  if (replicated) {
    const auto d = static_cast<std::size_t>(size_);
    const std::size_t per = (n + d - 1) / d, r = static_cast<std::size_t>(rank_);
    return {std::min(n, r * per), std::min(n, (r + 1) * per)};
  }
  if (replicate_ && replicate_->rank() != 0) return {0, 0};
  return {std::min(n, g.owned.begin), std::min(n, g.owned.end)};
}

namespace {

template <class U>
StatePiece piece(const std::string& kind, const Segment& s, std::span<const U> values) {
  StatePiece p{
      kind + "/" + s.param->name, s.param->shape, comm::dtype_v<U>, s.param_begin, s.count, {}};
  p.bytes.resize(s.count * sizeof(U));
  std::memcpy(p.bytes.data(), values.data(), p.bytes.size());
  return p;
}

StatePiece scalar(const std::string& name, int64_t v) {
  StatePiece p{name, {}, comm::DType::i64, 0, 1, std::vector<std::byte>(sizeof(int64_t))};
  std::memcpy(p.bytes.data(), &v, sizeof v);
  return p;
}

}  // namespace

template <class T>
std::vector<StatePiece> EngineImpl<T>::export_state() const {
  std::vector<StatePiece> out;
  for (const Group<T>& g : groups_) {
    // Parameters: the working copy (bf16 in the bf16 recipe, else the master itself).
    const Range pr = write_range(g, !g.sharded);
    const std::size_t pbase = g.sharded ? g.owned.begin : 0;
    for (const Segment& s : g.layout.segments(pr)) {
      const auto first = g.params.begin() + static_cast<std::ptrdiff_t>(s.flat_begin - pbase);
      if (bf16_) {
        std::vector<comm::bf16> b(s.count);
        for (std::size_t i = 0; i < s.count; ++i)
          b[i] = comm::bf16(static_cast<float>(first[static_cast<std::ptrdiff_t>(i)]));
        out.push_back(piece<comm::bf16>("param", s, b));
      } else {
        out.push_back(piece<T>("param", s, std::span<const T>(&*first, s.count)));
      }
    }
    // Optimizer state of the owned range (replicated over the DP group for DDP / no_shard).
    const bool replicated = g.owned.size() == g.layout.numel() && size_ > 1;
    const Range orange = write_range(g, replicated);
    for (const Segment& s : g.layout.segments(orange)) {
      const std::size_t at = s.flat_begin - g.owned.begin;
      if (bf16_)
        out.push_back(piece<T>("master", s, std::span<const T>(g.master).subspan(at, s.count)));
      out.push_back(piece<T>("exp_avg", s, std::span<const T>(g.m).subspan(at, s.count)));
      out.push_back(piece<T>("exp_avg_sq", s, std::span<const T>(g.v).subspan(at, s.count)));
    }
  }
  if (dp_.rank() == 0) {
    out.push_back(scalar("train/step", steps_));
    out.push_back(scalar("optimizer/step", adam_t_));
  }
  return out;
}

template <class T>
void EngineImpl<T>::import_state(const StateReader& read) {
  const auto fetch = [&]<class U>(const std::string& name, const Segment& s, std::span<U> dst) {
    read(name, comm::dtype_v<U>, s.param_begin, s.count, std::as_writable_bytes(dst));
  };
  for (Group<T>& g : groups_) {
    const Range need = g.sharded ? Range{g.owned.begin, std::min(g.owned.end, g.layout.numel())}
                                 : Range{0, g.layout.numel()};
    const std::size_t pbase = g.sharded ? g.owned.begin : 0;
    for (const Segment& s : g.layout.segments(need)) {
      const std::span<T> dst = std::span<T>(g.params).subspan(s.flat_begin - pbase, s.count);
      if (bf16_) {
        std::vector<comm::bf16> b(s.count);
        fetch("param/" + s.param->name, s, std::span<comm::bf16>(b));
        for (std::size_t i = 0; i < s.count; ++i) dst[i] = static_cast<T>(static_cast<float>(b[i]));
      } else {
        fetch("param/" + s.param->name, s, dst);
      }
    }
    const Range owned{g.owned.begin, std::min(g.owned.end, g.layout.numel())};
    for (const Segment& s : g.layout.segments(owned)) {
      const std::size_t at = s.flat_begin - g.owned.begin;
      if (bf16_) fetch("master/" + s.param->name, s, std::span<T>(g.master).subspan(at, s.count));
      fetch("exp_avg/" + s.param->name, s, std::span<T>(g.m).subspan(at, s.count));
      fetch("exp_avg_sq/" + s.param->name, s, std::span<T>(g.v).subspan(at, s.count));
    }
    if (!g.sharded) unpack_units(g, std::span<const T>(g.params));
  }
  int64_t v = 0;
  read("train/step", comm::DType::i64, 0, 1, std::as_writable_bytes(std::span<int64_t>(&v, 1)));
  steps_ = static_cast<int>(v);
  read("optimizer/step", comm::DType::i64, 0, 1, std::as_writable_bytes(std::span<int64_t>(&v, 1)));
  adam_t_ = static_cast<int>(v);
}

template <class T>
std::size_t EngineImpl<T>::param_elems() const {
  std::size_t n = 0;
  for (const Group<T>& g : groups_) n += g.params.size();
  return n;
}

template <class T>
std::size_t EngineImpl<T>::optimizer_elems() const {
  std::size_t n = 0;
  for (const Group<T>& g : groups_) n += g.m.size() + g.v.size();
  return n;
}

template <class T>
std::size_t EngineImpl<T>::padding() const {
  std::size_t n = 0;
  for (const Group<T>& g : groups_) n += g.layout.padding();
  return n;
}

#define SHARDCHECK_ENGINE_STATE(T)                                        \
  template ref::ParamMap<double> EngineImpl<T>::full_params();            \
  template Range EngineImpl<T>::write_range(const Group<T>&, bool) const; \
  template std::vector<StatePiece> EngineImpl<T>::export_state() const;   \
  template void EngineImpl<T>::import_state(const StateReader&);          \
  template std::size_t EngineImpl<T>::param_elems() const;                \
  template std::size_t EngineImpl<T>::optimizer_elems() const;            \
  template std::size_t EngineImpl<T>::padding() const;
SHARDCHECK_ENGINE_STATE(double)
SHARDCHECK_ENGINE_STATE(float)
#undef SHARDCHECK_ENGINE_STATE

}  // namespace shardcheck::parallel
