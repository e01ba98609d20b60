// python/src/page_store_binding.cc — kvtier's page stores (StorageBackend: file://, redis://,
// redis+cluster://, memory://) driven from Python in batches, for engine integrations that keep
// their own host KV pool (SGLang's HiCache storage, vLLM's KV connector):
//
//   kvtier.PageStore(url, *, model_id, kv_dtype, layout, mla, num_layers, slot_bytes, page_size,
//                    head_num=1, tp_rank=0, tp_size=1, **options)
//     .exists(keys) / .exists_prefix(keys)
//     .get(keys, addrs, *, layer_stride=0) / .set(keys, addrs, parents=None, *, layer_stride=0)
//     .submit_get(...) / .submit_set(...) -> kvtier.PageStoreJob (same arguments)
//     .remove(keys) / .clear() / .stats() / .close()
//
// Pages move directly between caller memory (raw host addresses) and the store, in C++ on the
// backend's I/O threads; the calling thread parses the arguments under the GIL and waits (blocking
// calls) with the GIL released. No per-page Python code runs.
//
// Keys (ReadPageKeys): a str of 64 lowercase hex digits is a PageKey as is (kvtier's and SGLang's
// page keys); 32 bytes are a PageKey as is (vLLM's sha256 block hashes); any other str is the
// SHA-256 of its UTF-8 bytes, other bytes the SHA-256 of the bytes, an int the SHA-256 of its
// decimal text ("-12", "340282366920938463463374607431768211455").
//
// Addresses (ReadPageAddrs): per page one address (the page's payload is one contiguous range of
// page_bytes) or two (K then V, page_bytes / 2 each; not for MLA). CONTRACT: the caller keeps
// that memory alive and untouched until the call returns (get / set) or its job is done.
//
// Layer-strided pages (layer_stride > 0: a layer_first host pool, where a page is num_layers
// pieces per buffer): each address is the page's layer-0 piece of its buffer, layer l's piece is
// at address + l * layer_stride, and a piece is page_bytes / num_buffers / num_layers bytes. Such
// pages are gathered into staging memory (StagedPages) before a set and scattered from it after a
// get (hits only), so a stored page holds the same bytes as the page of a page_first pool of the
// same geometry: K of every layer, then V of every layer.
//
// Parents (set): parents[i] is the key of the page before keys[i] in its prompt, or None
// (unknown, or a prompt's first page); passed to StorageBackend::SetAsync so file:// and
// memory:// evict a chain's tail before its head.
//
// Outcomes: a page that fails for any reason of the store (absent, corrupt, another namespace,
// timed out, I/O error, no space, the queue full, the store closed) is False. Bad arguments are
// kvtier.InvalidArgumentError (a ValueError) naming the argument and position; a call on a closed
// PageStore is kvtier.FailedPreconditionError.
//
// Options (keywords): the storage options (StorageOptionsSchema) and the KV-events options
// (StoreKvEventsConfigSchema: kv_events_endpoint, kv_events_replay_endpoint, kv_events_topic,
// kv_events_medium). With a kv_events_endpoint the store publishes KV events (kvtier/kv_events.h,
// "a page store's events") from C++ on the I/O thread that completes each call: BlockStored for
// the pages a set wrote, BlockRemoved for the pages the store evicted by itself and the pages
// remove() / clear() removed. Publishing only queues (the publisher's own thread sends), so no
// call waits for the socket.
//
// Thread safety: every method may be called from several Python threads at once; close() waits
// for the calls in flight (each ends within the store's timeout_ms).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cache_config_table.h"
#include "errors.h"
#include "kvtier/kv_events.h"
#include "kvtier/layout.h"
#include "kvtier/page_key.h"
#include "kvtier/storage.h"
#include "py_args.h"

namespace py = pybind11;

namespace kvtier::python {
namespace {

std::string Repr(py::handle h) { return py::repr(h).cast<std::string>(); }

// ---- arguments --------------------------------------------------------------------------------

std::string TextArg(py::handle value, std::string_view name) {
  if (!PyUnicode_Check(value.ptr())) {
    ThrowInvalid(fmt::format("PageStore: {} = {} must be a str", name, Repr(value)));
  }
  return value.cast<std::string>();
}

// The namespace of a PageStore's pages: every field of StorageNamespace from its keyword
// argument (the one place they are mapped), checked by StorageNamespace::Validate.
StorageNamespace NamespaceFromArgs(py::handle model_id, py::handle kv_dtype, py::handle layout,
                                   py::handle mla, py::handle num_layers, py::handle slot_bytes,
                                   py::handle page_size, py::handle head_num, py::handle tp_rank,
                                   py::handle tp_size) {
  StorageNamespace ns;
  ns.model_id = TextArg(model_id, "model_id");
  ns.kv_dtype = TextArg(kv_dtype, "kv_dtype");
  ns.layout = Unwrap(ParseLayout(TextArg(layout, "layout")));
  if (!PyBool_Check(mla.ptr())) {
    ThrowInvalid(fmt::format("PageStore: mla = {} must be True or False", Repr(mla)));
  }
  ns.mla = mla.ptr() == Py_True;
  ns.num_layers = ReadInt(num_layers, "PageStore: num_layers", 1, INT32_MAX);
  ns.slot_bytes = ReadInt(slot_bytes, "PageStore: slot_bytes", 1, INT32_MAX);
  ns.page_size = ReadInt(page_size, "PageStore: page_size", 1, INT32_MAX);
  ns.head_num = ReadInt(head_num, "PageStore: head_num", 1, INT32_MAX);
  ns.tp_rank = ReadInt(tp_rank, "PageStore: tp_rank", 0, INT32_MAX);
  ns.tp_size = ReadInt(tp_size, "PageStore: tp_size", 1, INT32_MAX);
  ThrowIfError(ns.Validate());
  return ns;
}

bool IsLowerHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

PageKey Sha256Key(std::string_view bytes, size_t index) {
  // ChainSeed(text) is SHA-256(text) for non-empty text.
  if (bytes.empty()) ThrowInvalid(fmt::format("keys[{}] is empty", index));
  return *ChainSeed(bytes);
}

PageKey ReadPageKey(py::handle key, size_t index) {
  PyObject* o = key.ptr();
  if (PyUnicode_Check(o)) {
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(o, &size);
    if (data == nullptr) throw py::error_already_set();
    const std::string_view text(data, static_cast<size_t>(size));
    if (text.size() == 64 && IsLowerHex(text)) return Unwrap(PageKey::FromHex(text));
    return Sha256Key(text, index);
  }
  if (PyBytes_Check(o)) {
    const std::string_view bytes(PyBytes_AS_STRING(o), static_cast<size_t>(PyBytes_GET_SIZE(o)));
    if (bytes.size() == 32) {
      PageKey k;
      std::memcpy(k.bytes.data(), bytes.data(), 32);
      return k;
    }
    return Sha256Key(bytes, index);
  }
  if (!PyBool_Check(o) && !PyFloat_Check(o) && PyIndex_Check(o)) {  // int, numpy integers
    const py::object value = py::reinterpret_steal<py::object>(PyNumber_Index(o));
    if (!value) throw py::error_already_set();
    return Sha256Key(py::str(value).cast<std::string>(), index);
  }
  ThrowInvalid(
      fmt::format("keys[{}] = {} must be a str, bytes or int (a page key)", index, Repr(key)));
}

std::vector<PageKey> ReadPageKeys(py::handle keys) {
  if (!PyList_Check(keys.ptr()) && !PyTuple_Check(keys.ptr())) {
    ThrowInvalid(fmt::format("keys must be a list or tuple of page keys, not {}",
                             Py_TYPE(keys.ptr())->tp_name));
  }
  py::sequence seq = py::reinterpret_borrow<py::sequence>(keys);
  std::vector<PageKey> out;
  out.reserve(seq.size());
  for (size_t i = 0; i < seq.size(); ++i) out.push_back(ReadPageKey(seq[i], i));
  return out;
}

// An address of caller memory: a positive integer.
uint64_t ReadAddr(py::handle value, size_t page, int segment, int per_page) {
  const std::string name =
      per_page == 1 ? fmt::format("addrs[{}]", page) : fmt::format("addrs[{}][{}]", page, segment);
  return static_cast<uint64_t>(ReadInt(value, name, 1, INT64_MAX));
}

// Per page `per_page` addresses (1 or 2), flattened page-major.
struct PageAddrs {
  std::vector<uint64_t> addrs;
  int per_page = 1;
};

PageAddrs ReadPageAddrs(py::handle obj, size_t num_pages) {
  PageAddrs out;
  PyObject* o = obj.ptr();
  if (PyList_Check(o) || PyTuple_Check(o)) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
    if (seq.size() != num_pages) {
      ThrowInvalid(
          fmt::format("addrs has {} entries for {} keys (one address or one (K, V) pair "
                      "per page)",
                      seq.size(), num_pages));
    }
    if (num_pages == 0) return out;
    const py::object first = seq[0];
    out.per_page =
        (PyList_Check(first.ptr()) || PyTuple_Check(first.ptr())) ? 2 : 1;  // pairs or ints
    out.addrs.reserve(num_pages * static_cast<size_t>(out.per_page));
    for (size_t i = 0; i < num_pages; ++i) {
      const py::object item = seq[i];
      if (out.per_page == 1) {
        out.addrs.push_back(ReadAddr(item, i, 0, 1));
        continue;
      }
      if (!(PyList_Check(item.ptr()) || PyTuple_Check(item.ptr())) || py::len(item) != 2) {
        ThrowInvalid(fmt::format("addrs[{}] = {} must be a (K, V) pair of addresses like addrs[0]",
                                 i, Repr(item)));
      }
      const py::sequence pair = py::reinterpret_borrow<py::sequence>(item);
      out.addrs.push_back(ReadAddr(pair[0], i, 0, 2));
      out.addrs.push_back(ReadAddr(pair[1], i, 1, 2));
    }
    return out;
  }
  if (!PyObject_CheckBuffer(o)) {
    ThrowInvalid(
        fmt::format("addrs must be a list of ints, a list of (K, V) pairs or an int64 "
                    "array of shape [n] or [n, 2], not {}",
                    Py_TYPE(o)->tp_name));
  }
  const py::buffer_info info = py::reinterpret_borrow<py::buffer>(obj).request();
  const bool int64 = info.itemsize == 8 && (info.format == "l" || info.format == "q" ||
                                            info.format == "L" || info.format == "Q");
  if (!int64) {
    ThrowInvalid(
        fmt::format("addrs: an array of addresses must hold int64 or uint64, not format "
                    "'{}' of {} bytes",
                    info.format, info.itemsize));
  }
  if (!(info.ndim == 1 || (info.ndim == 2 && info.shape[1] == 2))) {
    ThrowInvalid(fmt::format("addrs: an array of addresses must have shape [n] or [n, 2], not {}",
                             Repr(py::tuple(py::cast(info.shape)))));
  }
  if (static_cast<size_t>(info.shape[0]) != num_pages) {
    ThrowInvalid(
        fmt::format("addrs has {} rows for {} keys (one address or one (K, V) pair per page)",
                    info.shape[0], num_pages));
  }
  out.per_page = info.ndim == 1 ? 1 : 2;
  out.addrs.reserve(num_pages * static_cast<size_t>(out.per_page));
  const auto* base = static_cast<const char*>(info.ptr);
  for (size_t i = 0; i < num_pages; ++i) {
    for (int s = 0; s < out.per_page; ++s) {
      const char* p = base + static_cast<ssize_t>(i) * info.strides[0] +
                      (info.ndim == 2 ? s * info.strides[1] : 0);
      int64_t v;
      std::memcpy(&v, p, sizeof(v));
      if (v <= 0) {
        ThrowInvalid(out.per_page == 1
                         ? fmt::format("addrs[{}] = {} must be a positive address", i, v)
                         : fmt::format("addrs[{}][{}] = {} must be a positive address", i, s, v));
      }
      out.addrs.push_back(static_cast<uint64_t>(v));
    }
  }
  return out;
}

// ---- jobs -------------------------------------------------------------------------------------

// The outcome of one PageStore call, filled by the backend's callbacks (one per chunk of at most
// max_batch_pages pages) on its I/O threads.
class JobState {
 public:
  JobState(size_t num_pages, size_t num_chunks)
      : pages_(num_pages, PageStatus::kSkipped), remaining_(num_chunks) {}

  // A chunk's result, for pages [offset, offset + result.pages.size()).
  void Complete(size_t offset, const BatchResult& result) {
    std::lock_guard<std::mutex> lock(mu_);
    std::copy(result.pages.begin(), result.pages.end(), pages_.begin() + offset);
    if (result.status.code() == StatusCode::kInvalidArgument && error_.ok()) {
      error_ = result.status;  // our validation missed something: say so rather than "False"
    }
    if (--remaining_ == 0) cv_.notify_all();
  }

  bool done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return remaining_ == 0;
  }

  // REQUIRES the GIL released. False at the timeout.
  bool Wait(std::optional<std::chrono::duration<double>> timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [this] { return remaining_ == 0; };
    if (!timeout) {
      cv_.wait(lock, ready);
      return true;
    }
    return cv_.wait_for(lock, *timeout, ready);
  }

  // REQUIRES done().
  std::vector<bool> Outcome() const {
    std::lock_guard<std::mutex> lock(mu_);
    ThrowIfError(error_);
    std::vector<bool> out(pages_.size());
    for (size_t i = 0; i < pages_.size(); ++i) out[i] = pages_[i] == PageStatus::kOk;
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<PageStatus> pages_;
  size_t remaining_;
  Status error_;
};

class PageStoreJob {
 public:
  explicit PageStoreJob(std::shared_ptr<JobState> state) : state_(std::move(state)) {}

  bool done() const { return state_->done(); }

  std::vector<bool> wait(std::optional<double> timeout_s) {
    if (timeout_s && !(*timeout_s >= 0)) {
      ThrowInvalid(
          fmt::format("PageStoreJob.wait: timeout_s = {} must be >= 0 or None", *timeout_s));
    }
    bool finished;
    {
      py::gil_scoped_release release;
      std::optional<std::chrono::duration<double>> timeout;
      if (timeout_s) timeout = std::chrono::duration<double>(std::min(*timeout_s, 1e6));
      finished = state_->Wait(timeout);
    }
    if (!finished) {
      PyErr_SetString(PyExc_TimeoutError, "PageStoreJob.wait: the job is not done yet");
      throw py::error_already_set();
    }
    return state_->Outcome();
  }

 private:
  std::shared_ptr<JobState> state_;
};

// ---- layer-strided pages ----------------------------------------------------------------------

// Where one buffer (K, V or the MLA buffer) of a batch's pages lies in caller memory: per page the
// address of its layer-0 piece; layer l's piece is at that address + l * layer_stride.
struct StridedLayout {
  int64_t layer_stride = 0;  // > 0
  int64_t num_layers = 1;
  size_t piece_bytes = 0;  // one layer's bytes of one buffer of one page
};

// Staging memory for layer-strided pages: one buffer per call, kept for reuse by later calls (at
// most kMaxIdle idle buffers, the largest), so a steady stream of batches does not fault in fresh
// memory. Two: an engine's prefetch and backup streams (SGLang: one call in flight each).
// Thread safety: Take and Return may be called from any thread.
class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  // A buffer of at least `bytes` bytes, returned to the pool when the last holder drops it.
  std::shared_ptr<std::byte[]> Take(size_t bytes) {
    std::unique_ptr<std::byte[]> memory;
    size_t capacity = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = std::find_if(idle_.begin(), idle_.end(),
                             [&](const Idle& b) { return b.capacity >= bytes; });
      if (it != idle_.end()) {
        memory = std::move(it->memory);
        capacity = it->capacity;
        idle_.erase(it);
      }
    }
    if (!memory) {
      memory.reset(new std::byte[bytes]);  // uninitialised: every byte is written before use
      capacity = bytes;
    }
    std::weak_ptr<StagingPool> pool = weak_from_this();
    return std::shared_ptr<std::byte[]>(memory.release(), [pool, capacity](std::byte* p) {
      std::unique_ptr<std::byte[]> owned(p);
      if (std::shared_ptr<StagingPool> live = pool.lock()) live->Return(std::move(owned), capacity);
    });
  }

 private:
  static constexpr size_t kMaxIdle = 2;
  struct Idle {
    std::unique_ptr<std::byte[]> memory;
    size_t capacity = 0;
  };

  void Return(std::unique_ptr<std::byte[]> memory, size_t capacity) {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_.size() < kMaxIdle) {
      idle_.push_back({std::move(memory), capacity});
      return;
    }
    // Full: keep the larger buffers (they serve every smaller batch).
    auto smallest = std::min_element(idle_.begin(), idle_.end(), [](const Idle& a, const Idle& b) {
      return a.capacity < b.capacity;
    });
    if (smallest->capacity < capacity) *smallest = {std::move(memory), capacity};
  }

  std::mutex mu_;
  std::vector<Idle> idle_;  // guarded by mu_
};

// One batch of layer-strided pages and its staging memory: page i, buffer b is staged contiguous
// (its pieces in layer order) at staging + (i * num_buffers + b) * segment.
class StagedPages {
 public:
  StagedPages(StagingPool& pool, std::vector<uint64_t> addrs, int num_buffers,
              const StridedLayout& layout)
      : addrs_(std::move(addrs)),
        num_buffers_(num_buffers),
        layout_(layout),
        segment_(layout.piece_bytes * static_cast<size_t>(layout.num_layers)),
        memory_(pool.Take(segment_ * addrs_.size())) {}

  // The backend's buffers over pages [begin, end) of the staging memory.
  std::vector<PageBuffer> Buffers(size_t begin, size_t end) const {
    std::vector<PageBuffer> out;
    out.reserve(end - begin);
    for (size_t i = begin; i < end; ++i) {
      auto span = [&](int b) { return std::span<std::byte>(Staged(i, b), segment_); };
      out.push_back(num_buffers_ == 1 ? PageBuffer::Of(span(0)) : PageBuffer::Of(span(0), span(1)));
    }
    return out;
  }

  // Caller memory -> staging, pages [begin, end).
  void Gather(size_t begin, size_t end) const {
    for (size_t i = begin; i < end; ++i) {
      for (int b = 0; b < num_buffers_; ++b) {
        for (int64_t l = 0; l < layout_.num_layers; ++l) {
          std::memcpy(Staged(i, b) + l * layout_.piece_bytes, Piece(i, b, l), layout_.piece_bytes);
        }
      }
    }
  }

  // Staging -> caller memory, page i.
  void Scatter(size_t i) const {
    for (int b = 0; b < num_buffers_; ++b) {
      for (int64_t l = 0; l < layout_.num_layers; ++l) {
        std::memcpy(Piece(i, b, l), Staged(i, b) + l * layout_.piece_bytes, layout_.piece_bytes);
      }
    }
  }

 private:
  std::byte* Staged(size_t page, int b) const {
    return memory_.get() +
           (page * static_cast<size_t>(num_buffers_) + static_cast<size_t>(b)) * segment_;
  }
  std::byte* Piece(size_t page, int b, int64_t layer) const {
    return reinterpret_cast<std::byte*>(
        addrs_[page * static_cast<size_t>(num_buffers_) + static_cast<size_t>(b)] +
        static_cast<uint64_t>(layer * layout_.layer_stride));
  }

  const std::vector<uint64_t> addrs_;  // page-major, num_buffers per page
  const int num_buffers_;
  const StridedLayout layout_;
  const size_t segment_;  // one buffer's bytes of one page
  const std::shared_ptr<std::byte[]> memory_;
};

// ---- the store --------------------------------------------------------------------------------

enum class Op { kGet, kSet };

class PageStore {
 public:
  PageStore(std::string url, StorageNamespace ns, StorageOptions options,
            const StoreKvEventsConfig& events)
      : url_(RedactUrl(url)), ns_(std::move(ns)) {
    Result<std::unique_ptr<StorageBackend>> opened = Status::Internal("unset");
    Result<std::unique_ptr<KvEventPublisher>> publisher = Status::Internal("unset");
    {
      py::gil_scoped_release release;  // a Redis connect may take up to its timeout
      if (events.enabled()) publisher = KvEventPublisher::Open(events.PublisherConfig());
      if (!events.enabled() || publisher.ok()) opened = OpenStorage(url, ns_, options);
    }
    if (events.enabled() && !publisher.ok()) {
      // A value the option cannot take (no such transport, an address in use): a config error
      // naming the field, as for any other option.
      ThrowStatus(Status::InvalidArgument(
          fmt::format("PageStore: kv_events_endpoint = '{}' (kv_events_replay_endpoint = '{}') "
                      "cannot be opened: {}",
                      events.kv_events_endpoint, events.kv_events_replay_endpoint,
                      publisher.status().message())));
    }
    backend_ = Unwrap(std::move(opened));
    max_batch_ = static_cast<size_t>(backend_->options().max_batch_pages);
    if (events.enabled()) {
      publisher_ = std::shared_ptr<KvEventPublisher>(std::move(*publisher));
      kv_events_endpoints_[0] = publisher_->endpoint();
      kv_events_endpoints_[1] = publisher_->replay_endpoint();
      std::string medium = events.kv_events_medium;
      if (medium.empty()) medium = StorageMediumOf(url);
      events_ = std::make_shared<StoreKvEvents>(publisher_, std::move(medium), ns_.page_size);
      backend_->TrackEvictions(true);
    }
  }
  ~PageStore() {
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      CloseBackend();
    } else {
      CloseBackend();
    }
  }

  int64_t page_bytes() const { return ns_.page_bytes(); }
  int num_buffers() const { return ns_.mla ? 1 : 2; }
  const std::string& url() const { return url_; }
  std::string namespace_name() const { return ns_.Name(); }
  // The KV events' sockets as bound ("tcp://127.0.0.1:41234" for a '*' port); "" without events.
  const std::string& kv_events_endpoint() const { return kv_events_endpoints_[0]; }
  const std::string& kv_events_replay_endpoint() const { return kv_events_endpoints_[1]; }
  // The medium of the store's KV events; "" without events.
  std::string kv_events_medium() const { return events_ ? events_->medium() : std::string(); }

  std::vector<bool> exists(py::handle keys_obj) {
    std::vector<PageKey> keys = ReadPageKeys(keys_obj);
    std::shared_ptr<StorageBackend> b = Backend("exists");
    py::gil_scoped_release release;
    // One single-key Exists per page (ExistsResult tells only the leading run), at most `window`
    // in flight so a long list does not fill the backend's queue.
    const size_t window = static_cast<size_t>(std::max(1, b->options().max_queued_batches / 4));
    std::vector<bool> out(keys.size(), false);
    for (size_t start = 0; start < keys.size(); start += window) {
      const size_t end = std::min(keys.size(), start + window);
      std::vector<std::future<ExistsResult>> futures;
      for (size_t i = start; i < end; ++i) futures.push_back(b->Exists({keys[i]}));
      for (size_t i = start; i < end; ++i) {
        const ExistsResult r = futures[i - start].get();
        out[i] = r.status.ok() && r.leading == 1;
      }
    }
    return out;
  }

  int64_t exists_prefix(py::handle keys_obj) {
    std::vector<PageKey> keys = ReadPageKeys(keys_obj);
    std::shared_ptr<StorageBackend> b = Backend("exists_prefix");
    py::gil_scoped_release release;
    int64_t leading = 0;
    for (size_t start = 0; start < keys.size(); start += max_batch_) {
      const size_t end = std::min(keys.size(), start + max_batch_);
      const ExistsResult r =
          b->Exists(std::vector<PageKey>(keys.begin() + start, keys.begin() + end)).get();
      if (!r.status.ok()) break;
      leading += r.leading;
      if (static_cast<size_t>(r.leading) != end - start) break;
    }
    return leading;
  }

  // `parents_obj`: None or one parent key (or None) per key; set only. `layer_stride_obj`: 0 for
  // contiguous segments, else the bytes between a page's layers (layer-strided pages).
  std::shared_ptr<JobState> Submit(Op op, py::handle keys_obj, py::handle addrs_obj,
                                   py::handle parents_obj, py::handle layer_stride_obj) {
    std::vector<PageKey> keys = ReadPageKeys(keys_obj);
    PageAddrs addrs = ReadPageAddrs(addrs_obj, keys.size());
    if (addrs.per_page == 2 && ns_.mla) {
      ThrowInvalid("addrs: an MLA page is one buffer: give one address per page, not (K, V) pairs");
    }
    std::vector<std::optional<PageKey>> parents = ReadParents(parents_obj, keys.size());
    const std::optional<StridedLayout> strided = ReadLayerStride(layer_stride_obj, addrs);
    const char* call = op == Op::kGet ? "get" : "set";
    std::shared_ptr<StorageBackend> b = Backend(call);
    std::shared_ptr<StagedPages> staged;
    std::vector<PageBuffer> buffers;
    if (strided) {
      staged =
          std::make_shared<StagedPages>(*staging_, std::move(addrs.addrs), num_buffers(), *strided);
    } else {
      buffers = DirectBuffers(addrs, keys.size());
    }
    const size_t num_chunks = std::max<size_t>(1, (keys.size() + max_batch_ - 1) / max_batch_);
    auto state = std::make_shared<JobState>(keys.size(), keys.empty() ? 0 : num_chunks);
    py::gil_scoped_release release;
    for (size_t start = 0; start < keys.size(); start += max_batch_) {
      const size_t end = std::min(keys.size(), start + max_batch_);
      std::vector<PageKey> chunk_keys(keys.begin() + start, keys.begin() + end);
      std::vector<PageBuffer> chunk_buffers =
          staged ? staged->Buffers(start, end)
                 : std::vector<PageBuffer>(buffers.begin() + start, buffers.begin() + end);
      if (op == Op::kGet) {
        // Layer-strided: the hits go from staging into caller memory before the job is done.
        auto done = [state, start, staged](BatchResult r) {
          if (staged) {
            for (size_t i = 0; i < r.pages.size(); ++i) {
              if (r.pages[i] == PageStatus::kOk) staged->Scatter(start + i);
            }
          }
          state->Complete(start, r);
        };
        b->GetAsync(std::move(chunk_keys), std::move(chunk_buffers), std::move(done));
        continue;
      }
      if (staged) staged->Gather(start, end);
      std::function<void(BatchResult)> done = [state, start, staged](BatchResult r) {
        state->Complete(start, r);
      };
      if (events_) {
        // The chunk's keys and parents outlive the call for its events, queued on the I/O thread
        // that completes the chunk before the job's outcome (a caller that saw the job done finds
        // its events published).
        auto chunk_parents = std::make_shared<std::vector<std::optional<PageKey>>>();
        if (!parents.empty()) chunk_parents->assign(parents.begin() + start, parents.begin() + end);
        done = [state, start, staged, events = events_, backend = b.get(),
                keys = std::make_shared<std::vector<PageKey>>(chunk_keys),
                chunk_parents](BatchResult r) {
          events->OnSet(*backend, *keys, *chunk_parents, r.pages);
          state->Complete(start, r);
        };
      }
      if (parents.empty()) {
        b->SetAsync(std::move(chunk_keys), std::move(chunk_buffers), std::move(done));
      } else {
        b->SetAsync(
            std::move(chunk_keys), std::move(chunk_buffers),
            std::vector<std::optional<PageKey>>(parents.begin() + start, parents.begin() + end),
            std::move(done));
      }
    }
    return state;
  }

  std::vector<bool> Run(Op op, py::handle keys, py::handle addrs, py::handle parents,
                        py::handle layer_stride) {
    std::shared_ptr<JobState> state = Submit(op, keys, addrs, parents, layer_stride);
    {
      py::gil_scoped_release release;
      state->Wait(std::nullopt);
    }
    return state->Outcome();
  }

  std::vector<bool> remove(py::handle keys_obj) {
    std::vector<PageKey> keys = ReadPageKeys(keys_obj);
    std::shared_ptr<StorageBackend> b = Backend("remove");
    py::gil_scoped_release release;
    std::vector<bool> out(keys.size(), false);
    for (size_t start = 0; start < keys.size(); start += max_batch_) {
      const size_t end = std::min(keys.size(), start + max_batch_);
      std::vector<PageKey> chunk(keys.begin() + start, keys.begin() + end);
      const BatchResult r = b->Remove(chunk).get();
      if (events_) events_->OnRemove(*b, chunk, r.pages);
      for (size_t i = start; i < end; ++i) out[i] = r.pages[i - start] == PageStatus::kOk;
    }
    return out;
  }

  // Removes every page of this namespace the store lists (StorageBackend::StoredKeys); returns
  // how many it removed. FailedPrecondition (raised) from a store that cannot list them.
  int64_t clear() {
    std::shared_ptr<StorageBackend> b = Backend("clear");
    py::gil_scoped_release release;
    Result<std::vector<PageKey>> listed = b->StoredKeys();
    if (!listed.ok()) ThrowStatus(listed.status().WithContext("PageStore.clear"));
    const std::vector<PageKey>& keys = *listed;
    int64_t removed = 0;
    for (size_t start = 0; start < keys.size(); start += max_batch_) {
      const size_t end = std::min(keys.size(), start + max_batch_);
      std::vector<PageKey> chunk(keys.begin() + start, keys.begin() + end);
      const BatchResult r = b->Remove(chunk).get();
      if (events_) events_->OnRemove(*b, chunk, r.pages);
      for (PageStatus p : r.pages) removed += p == PageStatus::kOk ? 1 : 0;
    }
    return removed;
  }

  // Waits (GIL released) until every event published before the call has been sent, up to
  // timeout_s; true when it has (and without events).
  bool flush_kv_events(double timeout_s) {
    if (!(timeout_s >= 0)) {
      ThrowInvalid(
          fmt::format("PageStore.flush_kv_events: timeout_s = {} must be >= 0", timeout_s));
    }
    std::shared_ptr<KvEventPublisher> publisher;
    {
      std::lock_guard<std::mutex> lock(mu_);
      publisher = publisher_;
    }
    if (!publisher) return true;
    py::gil_scoped_release release;
    return publisher->Flush(
        std::chrono::milliseconds(static_cast<int64_t>(std::min(timeout_s, 1e6) * 1000)));
  }

  py::dict stats() {
    std::shared_ptr<StorageBackend> b = Backend("stats");
    const StorageStats s = b->Stats();
    py::dict d;
#define KVTIER_PAGE_STORE_STAT_(f) d[#f] = s.f
    KVTIER_PAGE_STORE_STAT_(exists_calls);
    KVTIER_PAGE_STORE_STAT_(get_calls);
    KVTIER_PAGE_STORE_STAT_(set_calls);
    KVTIER_PAGE_STORE_STAT_(remove_calls);
    KVTIER_PAGE_STORE_STAT_(rejected_calls);
    KVTIER_PAGE_STORE_STAT_(get_hit_pages);
    KVTIER_PAGE_STORE_STAT_(get_absent_pages);
    KVTIER_PAGE_STORE_STAT_(get_corrupt_pages);
    KVTIER_PAGE_STORE_STAT_(get_wrong_namespace_pages);
    KVTIER_PAGE_STORE_STAT_(get_timed_out_pages);
    KVTIER_PAGE_STORE_STAT_(get_failed_pages);
    KVTIER_PAGE_STORE_STAT_(set_ok_pages);
    KVTIER_PAGE_STORE_STAT_(set_failed_pages);
    KVTIER_PAGE_STORE_STAT_(set_timed_out_pages);
    KVTIER_PAGE_STORE_STAT_(set_no_space_pages);
    KVTIER_PAGE_STORE_STAT_(removed_pages);
    KVTIER_PAGE_STORE_STAT_(bytes_read);
    KVTIER_PAGE_STORE_STAT_(bytes_written);
    KVTIER_PAGE_STORE_STAT_(get_seconds);
    KVTIER_PAGE_STORE_STAT_(set_seconds);
    KVTIER_PAGE_STORE_STAT_(get_queue_seconds);
    KVTIER_PAGE_STORE_STAT_(get_held_seconds);
    KVTIER_PAGE_STORE_STAT_(get_page_seconds);
    KVTIER_PAGE_STORE_STAT_(set_queue_seconds);
    KVTIER_PAGE_STORE_STAT_(set_page_seconds);
    KVTIER_PAGE_STORE_STAT_(get_held_calls);
    KVTIER_PAGE_STORE_STAT_(get_cached_pages);
    KVTIER_PAGE_STORE_STAT_(get_disk_pages);
    KVTIER_PAGE_STORE_STAT_(queued_batches);
    KVTIER_PAGE_STORE_STAT_(stored_pages);
    KVTIER_PAGE_STORE_STAT_(stored_bytes);
    KVTIER_PAGE_STORE_STAT_(capacity_bytes);
    KVTIER_PAGE_STORE_STAT_(evicted_pages);
#undef KVTIER_PAGE_STORE_STAT_
    std::shared_ptr<KvEventPublisher> publisher;
    {
      std::lock_guard<std::mutex> lock(mu_);
      publisher = publisher_;
    }
    if (publisher) {
      const KvEventPublisherStats e = publisher->stats();
      d["kv_events_published_batches"] = e.published_batches;
      d["kv_events_published_events"] = e.published_events;
      d["kv_events_dropped_batches"] = e.dropped_batches;
      d["kv_events_send_errors"] = e.send_errors;
    }
    return d;
  }

  void close() {
    py::gil_scoped_release release;
    CloseBackend();
  }

 private:
  // The backend's buffers straight over the caller's contiguous segments (zero copy).
  std::vector<PageBuffer> DirectBuffers(const PageAddrs& addrs, size_t num_pages) const {
    std::vector<PageBuffer> buffers;
    buffers.reserve(num_pages);
    const size_t segment = static_cast<size_t>(page_bytes() / addrs.per_page);
    for (size_t i = 0; i < num_pages; ++i) {
      auto span = [&](int s) {
        return std::span<std::byte>(
            reinterpret_cast<std::byte*>(addrs.addrs[i * addrs.per_page + s]), segment);
      };
      buffers.push_back(addrs.per_page == 1 ? PageBuffer::Of(span(0))
                                            : PageBuffer::Of(span(0), span(1)));
    }
    return buffers;
  }

  // None: no parents (unknown); else one parent key or None per key.
  static std::vector<std::optional<PageKey>> ReadParents(py::handle obj, size_t num_keys) {
    if (obj.is_none()) return {};
    if (!PyList_Check(obj.ptr()) && !PyTuple_Check(obj.ptr())) {
      ThrowInvalid(fmt::format("parents must be None or a list of page keys (or None), not {}",
                               Py_TYPE(obj.ptr())->tp_name));
    }
    py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
    if (seq.size() != num_keys) {
      ThrowInvalid(
          fmt::format("parents has {} entries for {} keys (one parent key or None per "
                      "key)",
                      seq.size(), num_keys));
    }
    std::vector<std::optional<PageKey>> out(num_keys);
    for (size_t i = 0; i < num_keys; ++i) {
      const py::object item = seq[i];
      if (item.is_none()) continue;
      try {
        out[i] = ReadPageKey(item, i);
      } catch (const py::error_already_set&) {
        throw;
      } catch (const std::exception& e) {
        ThrowInvalid(fmt::format("parents[{}] = {} must be None or a page key (str, bytes or int)",
                                 i, Repr(item)));
      }
    }
    return out;
  }

  // nullopt for layer_stride 0 (contiguous segments); else the strided layout, checked against
  // the namespace and the addresses given.
  std::optional<StridedLayout> ReadLayerStride(py::handle obj, const PageAddrs& addrs) const {
    const int64_t stride = ReadInt(obj, "layer_stride", 0, INT64_MAX);
    if (stride == 0) return std::nullopt;
    StridedLayout layout;
    layout.layer_stride = stride;
    layout.num_layers = ns_.num_layers;
    layout.piece_bytes = static_cast<size_t>(page_bytes() / num_buffers() / ns_.num_layers);
    if (!addrs.addrs.empty() && addrs.per_page != num_buffers()) {
      ThrowInvalid(fmt::format(
          "addrs: layer-strided pages need {} per page (the layer-0 piece of {}), not {}",
          num_buffers() == 1 ? "one address" : "a (K, V) pair of addresses",
          num_buffers() == 1 ? "the MLA buffer" : "K and of V", addrs.per_page));
    }
    if (ns_.num_layers > 1 && static_cast<size_t>(stride) < layout.piece_bytes) {
      ThrowInvalid(
          fmt::format("layer_stride = {} is smaller than one layer's piece of a page "
                      "({} bytes): the layers would overlap",
                      stride, layout.piece_bytes));
    }
    return layout;
  }

  // The backend, held by the caller for the length of its call (close() may run meanwhile).
  std::shared_ptr<StorageBackend> Backend(const char* call) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!backend_) {
      ThrowStatus(
          Status::FailedPrecondition(fmt::format("PageStore.{}: the store is closed", call)));
    }
    return backend_;
  }

  // REQUIRES the GIL released (Close waits for calls in flight).
  void CloseBackend() {
    std::shared_ptr<StorageBackend> b;
    {
      std::lock_guard<std::mutex> lock(mu_);
      b = std::move(backend_);
    }
    if (b) {
      b->Close();
      if (events_) events_->OnEvictions(*b);
    }
    std::shared_ptr<KvEventPublisher> publisher;
    {
      std::lock_guard<std::mutex> lock(mu_);
      publisher = std::move(publisher_);
    }
    // Sends what is queued (up to the publisher's linger) before its sockets close.
    if (publisher) (void)publisher->Flush(std::chrono::milliseconds(2000));
  }

  const std::string url_;  // redacted
  const StorageNamespace ns_;
  size_t max_batch_ = 1;
  std::mutex mu_;
  std::shared_ptr<StorageBackend> backend_;  // null once closed
  // KV events (kv_events_endpoint set): the publisher (null once closed) and what feeds it; the
  // backend's callbacks hold events_, which holds the publisher as its sink.
  std::shared_ptr<KvEventPublisher> publisher_;
  std::shared_ptr<StoreKvEvents> events_;
  std::string kv_events_endpoints_[2];  // PUB, replay: as bound
  // Staging memory of layer-strided batches (shared: a batch's buffer outlives a closed store).
  const std::shared_ptr<StagingPool> staging_ = std::make_shared<StagingPool>();
};

// The keyword options of PageStore: each by name from the storage options' schema or the KV-events
// options' schema, checked by their Validate. InvalidArgument (raised) naming an unknown one.
void ReadOptions(const py::kwargs& given, StorageOptions* options, StoreKvEventsConfig* events) {
  py::dict storage_part, events_part;
  for (auto item : given) {
    const std::string name = py::str(item.first).cast<std::string>();
    if (FindField(StorageOptionsSchema(), name) != nullptr) {
      storage_part[item.first] = item.second;
    } else if (FindField(StoreKvEventsConfigSchema(), name) != nullptr) {
      events_part[item.first] = item.second;
    } else {
      std::vector<std::string> known;
      for (const auto& f : StorageOptionsSchema()) known.push_back(f.name);
      for (const auto& f : StoreKvEventsConfigSchema()) known.push_back(f.name);
      ThrowInvalid(fmt::format("PageStore: unknown keyword argument '{}' (the options are {})",
                               name, fmt::join(known, ", ")));
    }
  }
  ApplySettings(StorageOptionsSchema(), storage_part, "PageStore storage option", options);
  ApplySettings(StoreKvEventsConfigSchema(), events_part, "PageStore option", events);
  const FieldNamer namer = [](std::string_view field) {
    return fmt::format("PageStore: {}", field);
  };
  ThrowIfError(options->Validate(namer));
  ThrowIfError(events->Validate(namer));
}

}  // namespace

// long: the binding table, one .def per Python method of PageStore and PageStoreJob with its
// docstring; it reads as the classes' Python API.
void RegisterPageStore(py::module_& m) {
  py::class_<PageStoreJob>(m, "PageStoreJob",
                           "One submitted PageStore.get / set batch (PageStore.submit_get / "
                           "submit_set). The caller's page memory must stay alive until done().")
      .def("done", &PageStoreJob::done,
           "True once every page has its outcome. Never blocks on the store.")
      .def("wait", &PageStoreJob::wait, py::arg("timeout_s") = py::none(),
           "Waits (GIL released) and returns one bool per page: True = read / written, False = "
           "failed (absent, corrupt, other namespace, timed out, I/O error, no space, rejected). "
           "TimeoutError when the job is not done within timeout_s (None: until done; a job "
           "always ends within the store's timeout_ms of being taken by an I/O thread).");

  py::class_<PageStore>(m, "PageStore",
                        "kvtier's page stores (file://, redis://, redis+cluster://, memory://) "
                        "driven from Python in batches, moving pages between raw host addresses "
                        "and the store in C++ with the GIL released. See docs/architecture.md "
                        "(The Python layer).")
      .def(
          py::init([](const py::object& url, const py::object& model_id, const py::object& kv_dtype,
                      const py::object& layout, const py::object& mla, const py::object& num_layers,
                      const py::object& slot_bytes, const py::object& page_size,
                      const py::object& head_num, const py::object& tp_rank,
                      const py::object& tp_size, const py::kwargs& storage_options) {
            const std::string url_text = TextArg(url, "url");
            StorageNamespace ns =
                NamespaceFromArgs(model_id, kv_dtype, layout, mla, num_layers, slot_bytes,
                                  page_size, head_num, tp_rank, tp_size);
            StorageOptions options;
            StoreKvEventsConfig events;
            ReadOptions(storage_options, &options, &events);
            return std::make_unique<PageStore>(url_text, std::move(ns), options, events);
          }),
          py::arg("url"), py::kw_only(), py::arg("model_id"), py::arg("kv_dtype"),
          py::arg("layout"), py::arg("mla"), py::arg("num_layers"), py::arg("slot_bytes"),
          py::arg("page_size"), py::arg("head_num") = 1, py::arg("tp_rank") = 0,
          py::arg("tp_size") = 1,
          "Opens the store at `url` for the deployment the keyword arguments describe "
          "(kvtier::StorageNamespace: pages of another namespace are misses). `layout`: "
          "page_first, page_first_direct, layer_first or page_head. **options: the storage "
          "options (io_threads, max_queued_batches, timeout_ms, max_batch_pages, ...) and the "
          "KV-events options (kv_events_endpoint, kv_events_replay_endpoint, kv_events_topic, "
          "kv_events_medium): see kvtier.PageStore.storage_option_fields().")
      .def_static(
          "storage_option_fields",
          [] {
            py::list table = SchemaTable(StorageOptionsSchema());
            for (auto row : SchemaTable(StoreKvEventsConfigSchema())) table.append(row);
            return table;
          },
          "The options PageStore takes as keywords, the storage options then the KV-events "
          "options: [{name, kind, default, min, max, help}].")
      .def_property_readonly("page_bytes", &PageStore::page_bytes,
                             "Bytes of one page: num_buffers * num_layers * page_size * "
                             "slot_bytes.")
      .def_property_readonly("num_buffers", &PageStore::num_buffers, "1 for MLA, 2 for K and V.")
      .def_property_readonly("url", &PageStore::url, "The store's URL without credentials.")
      .def_property_readonly("namespace_name", &PageStore::namespace_name,
                             "The object-name prefix of this deployment's pages ('kv' + 16 hex).")
      .def_property_readonly("kv_events_endpoint", &PageStore::kv_events_endpoint,
                             "The KV events' PUB endpoint as bound (a '*' port resolved) or "
                             "connected; '' without events.")
      .def_property_readonly("kv_events_replay_endpoint", &PageStore::kv_events_replay_endpoint,
                             "The KV events' replay endpoint as bound; '' without one.")
      .def_property_readonly("kv_events_medium", &PageStore::kv_events_medium,
                             "The medium of the store's KV events; '' without events.")
      .def("exists", &PageStore::exists, py::arg("keys"),
           "One bool per key: whether the store holds that page (one store call per key; "
           "exists_prefix is one call per batch).")
      .def("exists_prefix", &PageStore::exists_prefix, py::arg("keys"),
           "The number of leading keys the store holds (stops at the first miss).")
      .def(
          "get",
          [](PageStore& s, py::handle k, py::handle a, py::handle stride) {
            return s.Run(Op::kGet, k, a, py::none(), stride);
          },
          py::arg("keys"), py::arg("addrs"), py::kw_only(), py::arg("layer_stride") = 0,
          "Reads each page into its address(es); blocks with the GIL released. One bool per "
          "page; a failed page's bytes are undefined. layer_stride > 0: each address is the "
          "page's layer-0 piece of its buffer and layer l's piece is at address + l * "
          "layer_stride (a layer_first host pool).")
      .def(
          "set",
          [](PageStore& s, py::handle k, py::handle a, py::handle parents, py::handle stride) {
            return s.Run(Op::kSet, k, a, parents, stride);
          },
          py::arg("keys"), py::arg("addrs"), py::arg("parents") = py::none(), py::kw_only(),
          py::arg("layer_stride") = 0,
          "Writes each page from its address(es); blocks with the GIL released. One bool per "
          "page. parents: None, or per key the key of the page before it in its prompt (None: "
          "unknown), so file:// and memory:// evict a chain's tail first. layer_stride: as "
          "get.")
      .def(
          "submit_get",
          [](PageStore& s, py::handle k, py::handle a, py::handle stride) {
            return PageStoreJob(s.Submit(Op::kGet, k, a, py::none(), stride));
          },
          py::arg("keys"), py::arg("addrs"), py::kw_only(), py::arg("layer_stride") = 0,
          "get, returning a PageStoreJob at once.")
      .def(
          "submit_set",
          [](PageStore& s, py::handle k, py::handle a, py::handle parents, py::handle stride) {
            return PageStoreJob(s.Submit(Op::kSet, k, a, parents, stride));
          },
          py::arg("keys"), py::arg("addrs"), py::arg("parents") = py::none(), py::kw_only(),
          py::arg("layer_stride") = 0,
          "set, returning a PageStoreJob at once (a layer-strided batch is gathered first).")
      .def("remove", &PageStore::remove, py::arg("keys"),
           "Removes the pages; one bool per key (True: removed or absent, as the backend says).")
      .def("clear", &PageStore::clear,
           "Removes every page of this namespace the store holds (file://: the namespace's "
           "directory, other processes' pages included; memory://: its map) and returns how "
           "many it removed. Pages written meanwhile may stay. FailedPreconditionError from a "
           "store that cannot list a namespace's pages (redis://).")
      .def("flush_kv_events", &PageStore::flush_kv_events, py::arg("timeout_s") = 10.0,
           "Waits (GIL released) until every KV event published before the call has been sent "
           "on the socket (stats()['kv_events_published_batches'] then counts them), up to "
           "timeout_s; True when it has. True without events.")
      .def("stats", &PageStore::stats, "The backend's counters (kvtier::StorageStats) as a dict.")
      .def("close", &PageStore::close,
           "Lets calls in flight finish and closes the store; later calls raise "
           "FailedPreconditionError. Idempotent.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PageStore& s, const py::args&) {
             s.close();
             return false;
           })
      .def("__repr__", [](const PageStore& s) {
        return fmt::format("kvtier.PageStore('{}', namespace={}, page_bytes={})", s.url(),
                           s.namespace_name(), s.page_bytes());
      });
}

}  // namespace kvtier::python
