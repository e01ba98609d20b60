// python/src/storage_binding.cc — the storage tier's page keys for Python:
//   kvtier.page_keys(tokens, page_size, salt="", as_int=False)
//       -> list of 64-character lowercase hex strings, or (as_int) of ints in [0, 2**64)
// SGLang HiCache's chained SHA-256 keys (kvtier/page_key.h), so Python code can name the pages a
// kvtier store holds. A trailing partial page gets no key. as_int gives the block hashes of
// kvtier's KV events (kvtier/kv_events.h: BlockHashOf), so a router computes from tokens alone
// the hashes the events name.
//
// Thread safety: a pure function; the hashing runs with the GIL released.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "errors.h"
#include "kvtier/kv_events.h"
#include "kvtier/page_key.h"
#include "py_args.h"

namespace py = pybind11;

namespace kvtier::python {

void RegisterStorage(py::module_& m) {
  m.def(
      "page_keys",
      [](py::handle token_list, py::handle page_size_arg, const std::string& salt, bool as_int) {
        // Read here, not by pybind11: a float or a str is a ValueError naming it, as for tokens.
        const int64_t page_size = ReadInt(page_size_arg, "page_size", 1, int64_t{1} << 20);
        const std::vector<int64_t> tokens = ReadIntList(token_list, "tokens", INT64_MIN, INT64_MAX);
        Result<std::vector<PageKey>> keys = Status::Internal("unset");
        {
          py::gil_scoped_release release;
          keys = ComputePageKeys(std::span<const int64_t>(tokens), page_size, ChainSeed(salt));
        }
        py::list out;
        for (const PageKey& key : Unwrap(std::move(keys))) {
          if (as_int) {
            out.append(py::int_(BlockHashOf(key)));
          } else {
            out.append(py::str(key.Hex()));
          }
        }
        return out;
      },
      py::arg("tokens"), py::arg("page_size"), py::arg("salt") = "", py::arg("as_int") = false,
      "Chained SHA-256 page keys of `tokens` (SGLang HiCache's): one 64-character lowercase hex "
      "string per whole page of `page_size` tokens. A non-empty `salt` (a tenant) seeds the "
      "chain. as_int=True gives each key as the block hash of kvtier's KV events instead: its "
      "last 8 bytes as a big-endian unsigned int (vLLM's rule for int block hashes). ValueError "
      "for a token outside [0, 2**32) or not an integer (a float, a bool), tokens that are not a "
      "list, tuple, range or 1-D integer array (a set, dict, str or bytes), or a page_size "
      "outside [1, 2**20].");
}

}  // namespace kvtier::python
