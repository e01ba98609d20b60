// python/src/tp_binding.cc — a tensor-parallel group from Python (see tp_binding.h; the Pythonic
// surface is python/kvtier/tp.py).
//
// The leader (rank 0) is a kvtier.HierarchicalCache made with a `tp` group: CreateTpLeaderCache
// below builds it, cache_binding.cc owns it. A follower (rank r > 0) is a `_TpFollower`: it
// attaches to the leader's ring, owns a host pool of the leader's shape in this rank's geometry,
// its transfer engine and (with a storage tier) its view of the per-head store, and applies the
// leader's decisions in Serve. There is no collective anywhere: torch.distributed (or anything
// else) is only needed to start the processes and agree on the group's name.
//
// Lifetime: a _TpFollower keeps the Python device region (its buffers) alive while it exists;
// close() releases the rank (detaches from the ring) and frees the host pool. Serve runs without
// the GIL; the message handler takes it for its Python call.
#include "tp_binding.h"

#include <fmt/format.h>
#include <pybind11/stl.h>

#include <cmath>
#include <mutex>
#include <string>
#include <utility>

#include "cache_config_table.h"
#include "errors.h"
#include "kvtier/host_pool.h"
#include "kvtier/tp_leader_cache.h"
#include "transfer_binding.h"

namespace py = pybind11;

namespace kvtier::python {
namespace {

// The host slots the cache makes for `config` beside `device` (HostKvPool's arithmetic: whole
// pages of every buffer within the budget). Checked against the cache's host region afterwards.
int64_t HostSlotsFor(const HierarchicalCacheConfig& config, const KvRegion& device) {
  if (!config.has_host_tier()) return 0;
  const KvGeometry& g = device.geometry;
  const long double page_bytes =
      static_cast<long double>(device.num_buffers()) * static_cast<long double>(g.num_layers) *
      static_cast<long double>(g.slot_bytes) * static_cast<long double>(g.page_size);
  const long double budget =
      config.host_capacity_bytes > 0
          ? static_cast<long double>(config.host_capacity_bytes)
          : std::floor(static_cast<long double>(config.host_ratio) *
                       static_cast<long double>(g.buffer_bytes() * device.num_buffers()));
  if (!(page_bytes > 0)) return 0;
  return static_cast<int64_t>(std::floor(budget / page_bytes)) * g.page_size;
}

int64_t HostHeadNum(const HierarchicalCacheConfig& config, const KvRegion& device) {
  return config.host_head_num > 0 ? config.host_head_num : device.geometry.head_num;
}

// What rank `rank`'s host pages hold, as the namespace of its view of the per-head store.
Result<StorageNamespace> RankPages(const HierarchicalCacheConfig& config, const KvRegion& device,
                                   int rank, int tp_size) {
  if (config.host_layout != KvLayout::kPageHead) {
    return Status::InvalidArgument(fmt::format(
        "tp group: a storage tier shared across TP sizes needs host_layout = 'page_head' (each "
        "head's bytes apart), not '{}'",
        LayoutName(config.host_layout)));
  }
  KvGeometry pages = device.geometry;
  pages.layout = KvLayout::kPageHead;
  pages.head_num = HostHeadNum(config, device);
  return StorageNamespaceOf(pages, device.mla,
                            {config.storage.model_id, config.storage.kv_dtype, rank, tp_size});
}

template <typename T>
T Get(const py::dict& d, const char* key, T fallback) {
  if (!d.contains(key)) return fallback;
  try {
    return d[key].cast<T>();
  } catch (const py::cast_error&) {
    ThrowStatus(Status::InvalidArgument(fmt::format("tp group: {} = {} has the wrong type", key,
                                                    py::repr(d[key]).cast<std::string>())));
  }
}

// Owns a follower rank; see the file comment.
class PyTpFollower {
 public:
  PyTpFollower(py::object keepalive, const PyRegion& device, const py::dict& settings,
               const py::dict& group)
      : keepalive_(std::move(keepalive)), device_(device) {
    const TpGroupConfig gc = TpGroupConfigFromDict(group);
    const int rank = Get<int>(group, "rank", -1);
    if (rank < 1 || rank >= gc.tp_size) {
      ThrowStatus(Status::InvalidArgument(fmt::format(
          "tp group: a follower's rank must be in [1, size = {}), got {}", gc.tp_size, rank)));
    }
    HierarchicalCacheConfig c = CacheConfigFromDict(settings);
    const KvRegion region = device_.Get();
    const bool gpu = region.memory == MemoryKind::kDevice;
    if (gpu) c.transfer.device = region.device;
    Status st = [&]() -> Status {
      py::gil_scoped_release release;
      KVTIER_ASSIGN_OR_RETURN(follower_, TpFollower::Attach(gc, rank));
      const TpShape& shape = follower_->shape();
      const KvGeometry& g = region.geometry;
      if (g.num_slots != shape.device_slots || g.num_layers != shape.num_layers ||
          g.page_size != shape.page_size || region.mla != shape.mla) {
        return Status::InvalidArgument(fmt::format(
            "tp rank {}: the device region has {} slots, {} layers, page size {}{}; the leader's "
            "group has {} slots, {} layers, page size {}{} (every rank's pool must have the "
            "leader's slot count)",
            rank, g.num_slots, g.num_layers, g.page_size, region.mla ? ", MLA" : "",
            shape.device_slots, shape.num_layers, shape.page_size, shape.mla ? ", MLA" : ""));
      }
      host_region_.geometry = g;
      host_region_.geometry.num_slots = 0;
      host_region_.mla = region.mla;
      if (shape.host_slots > 0) {
        HostKvPoolConfig hc;
        hc.geometry = g;
        hc.geometry.layout = c.host_layout;
        hc.geometry.head_num = HostHeadNum(c, region);
        hc.mla = region.mla;
        hc.capacity_bytes = shape.host_slots * region.num_buffers() * g.num_layers * g.slot_bytes;
        hc.huge_pages = c.host_huge_pages;
        hc.register_with_cuda = gpu;
        KVTIER_ASSIGN_OR_RETURN(host_, HostKvPool::Create(hc));
        host_region_ = host_->region();
        if (host_region_.geometry.num_slots != shape.host_slots) {
          return Status::Internal(fmt::format("tp rank {}: made {} host slots, the group has {}",
                                              rank, host_region_.geometry.num_slots,
                                              shape.host_slots));
        }
      }
      KVTIER_ASSIGN_OR_RETURN(engine_, MakeTransferEngine(c.transfer_backend, c.transfer));
      if (c.storage.enabled()) {
        KVTIER_ASSIGN_OR_RETURN(const StorageNamespace ns, RankPages(c, region, rank, gc.tp_size));
        KVTIER_ASSIGN_OR_RETURN(storage_, OpenTpRankStorage(c.storage.url, ns, c.storage.options));
      }
      return Status::OK();
    }();
    if (!st.ok()) {
      Reset();
      ThrowStatus(st);
    }
  }

  // Applies the records published so far (waiting up to wait_s for the first); "idle", "applied"
  // or "closed". `on_message(bytes) -> int` runs with the GIL for each engine message.
  std::string Serve(double wait_s, py::object on_message) {
    if (!(wait_s >= 0) || wait_s > 3600) {
      ThrowStatus(Status::InvalidArgument(fmt::format("wait_s = {} is not in [0, 3600]", wait_s)));
    }
    const std::unique_lock<std::mutex> one = OneThread();
    Open();
    TpFollower::MessageHandler handler;
    if (!on_message.is_none()) {
      handler = [&on_message](std::span<const std::byte> msg) -> Result<uint64_t> {
        py::gil_scoped_acquire gil;
        try {
          py::object r =
              on_message(py::bytes(reinterpret_cast<const char*>(msg.data()), msg.size()));
          const int64_t v = r.is_none() ? 0 : r.cast<int64_t>();
          if (v < 0) {
            return Status::InvalidArgument(
                fmt::format("on_message returned {}; expected a non-negative int or None", v));
          }
          return static_cast<uint64_t>(v);
        } catch (py::error_already_set& e) {
          return Status::Internal(fmt::format("on_message raised {}", e.what()));
        } catch (const py::cast_error&) {
          return Status::InvalidArgument("on_message returned something that is not an int");
        }
      };
    }
    const KvRegion region = device_.Get();
    Result<TpServeResult> r = [&] {
      py::gil_scoped_release release;
      return follower_->Serve(*engine_, region, host_region_, wait_s, handler, storage_.get());
    }();
    switch (Unwrap(std::move(r))) {
      case TpServeResult::kIdle:
        return "idle";
      case TpServeResult::kApplied:
        return "applied";
      case TpServeResult::kClosed:
        return "closed";
    }
    return "idle";
  }

  py::dict Shape() {
    const std::unique_lock<std::mutex> one = OneThread();
    const TpShape& s = Open().shape();
    py::dict d;
    d["device_slots"] = s.device_slots;
    d["host_slots"] = s.host_slots;
    d["num_layers"] = s.num_layers;
    d["page_size"] = s.page_size;
    d["mla"] = s.mla;
    return d;
  }

  py::dict Stats() {
    const std::unique_lock<std::mutex> one = OneThread();
    const TpFollowerStats s = Open().stats();
    py::dict d;
    d["records"] = s.records;
    d["slots"] = s.slots;
    d["applied_seq"] = s.applied_seq;
    return d;
  }

  int Rank() {
    const std::unique_lock<std::mutex> one = OneThread();
    return Open().rank();
  }

  // Releases the rank and frees the pools' host part; a second close() is a no-op.
  void Close() {
    const std::unique_lock<std::mutex> one = OneThread();
    py::gil_scoped_release release;
    Reset();
  }
  bool closed() const { return follower_ == nullptr; }

 private:
  // A follower is driven by one thread: a call while another thread is in one (Serve, whose
  // handler needs the GIL) is refused instead of waiting for it under the GIL.
  std::unique_lock<std::mutex> OneThread() {
    std::unique_lock<std::mutex> lock(serving_, std::try_to_lock);
    if (!lock.owns_lock()) {
      ThrowStatus(Status::FailedPrecondition(
          "another thread is in a call of this TpFollower (a follower is driven by one thread)"));
    }
    return lock;
  }
  TpFollower& Open() {
    if (follower_ == nullptr) ThrowStatus(Status::FailedPrecondition("the TpFollower is closed"));
    return *follower_;
  }
  void Reset() {
    follower_.reset();
    storage_.reset();
    engine_.reset();
    host_.reset();
  }

  py::object keepalive_;  // the Python region and its buffers
  PyRegion device_;
  std::unique_ptr<HostKvPool> host_;
  KvRegion host_region_;
  std::unique_ptr<TransferEngine> engine_;
  std::shared_ptr<StorageBackend> storage_;
  std::unique_ptr<TpFollower> follower_;
  std::mutex serving_;  // held by the one thread in a call
};

}  // namespace

TpGroupConfig TpGroupConfigFromDict(const py::dict& d) {
  py::dict fields;  // the group's fields; "rank" is the caller's (which process this is)
  for (auto item : d) {
    if (py::str(item.first).cast<std::string>() != "rank") fields[item.first] = item.second;
  }
  TpGroupConfig c;
  ApplySettings(TpGroupConfigSchema(), fields, "tp group", &c);
  ThrowIfError(c.Validate());
  return c;
}

py::list TpGroupConfigTable() { return SchemaTable(TpGroupConfigSchema()); }

Result<TpLeaderCache> CreateTpLeaderCache(HierarchicalCacheConfig config, const KvRegion& device,
                                          const TpGroupConfig& group) {
  if (config.shared_host) {
    return Status::InvalidArgument("tp group: a shared host tier is not supported in a TP group");
  }
  const KvGeometry& g = device.geometry;
  TpLeaderCache out;
  KVTIER_ASSIGN_OR_RETURN(out.leader,
                          TpLeader::Create(group, TpShape{g.num_slots, HostSlotsFor(config, device),
                                                          g.num_layers, g.page_size, device.mla}));
  std::shared_ptr<StorageBackend> rank_store;
  if (config.storage.enabled()) {
    if (config.storage.url.empty()) {
      return Status::InvalidArgument("tp group: the storage tier must be given as a URL");
    }
    KVTIER_ASSIGN_OR_RETURN(const StorageNamespace ns, RankPages(config, device, 0, group.tp_size));
    KVTIER_ASSIGN_OR_RETURN(rank_store,
                            OpenTpRankStorage(config.storage.url, ns, config.storage.options));
  }
  KVTIER_ASSIGN_OR_RETURN(std::unique_ptr<TransferEngine> engine,
                          MakeTransferEngine(config.transfer_backend, config.transfer));
  KVTIER_ASSIGN_OR_RETURN(out.cache, MakeTpLeaderCache(std::move(config), device, out.leader.get(),
                                                       std::move(engine), std::move(rank_store)));
  KVTIER_RETURN_IF_ERROR(out.leader->WaitForFollowers());
  return out;
}

void RegisterTp(py::module_& m) {
  py::class_<PyTpFollower>(m, "_TpFollower",
                           "A follower rank of a TP group; use kvtier.TpFollower.")
      .def(py::init<py::object, const PyRegion&, const py::dict&, const py::dict&>(),
           py::arg("region_keepalive"), py::arg("device_region"), py::arg("settings"),
           py::arg("group"))
      .def("serve", &PyTpFollower::Serve, py::arg("wait_s"), py::arg("on_message"))
      .def("shape", &PyTpFollower::Shape)
      .def("stats", &PyTpFollower::Stats)
      .def("rank", &PyTpFollower::Rank)
      .def("close", &PyTpFollower::Close)
      .def_property_readonly("closed", &PyTpFollower::closed);
  m.def("tp_group_fields", &TpGroupConfigTable,
        "The fields of a TP group's config (C++ TpGroupConfigSchema): name, kind, default, "
        "bounds, help.");
}

}  // namespace kvtier::python
