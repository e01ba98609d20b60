// python/src/storage_binding.cc — the storage tier's page keys for Python:
//   kvtier.page_keys(tokens, page_size, salt="") -> list of 64-character lowercase hex strings
// SGLang HiCache's chained SHA-256 keys (kvtier/page_key.h), so Python code can name the pages a
// kvtier store holds. A trailing partial page gets no key.
//
// Thread safety: a pure function; the hashing runs with the GIL released.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "errors.h"
#include "kvtier/page_key.h"
#include "py_args.h"

namespace py = pybind11;

namespace kvtier::python {

void RegisterStorage(py::module_& m) {
  m.def(
      "page_keys",
      [](py::handle token_list, int64_t page_size, const std::string& salt) {
        const std::vector<int64_t> tokens = ReadIntList(token_list, "tokens", INT64_MIN, INT64_MAX);
        Result<std::vector<PageKey>> keys = Status::Internal("unset");
        {
          py::gil_scoped_release release;
          keys = ComputePageKeys(std::span<const int64_t>(tokens), page_size, ChainSeed(salt));
        }
        std::vector<std::string> hex;
        for (const PageKey& key : Unwrap(std::move(keys))) hex.push_back(key.Hex());
        return hex;
      },
      py::arg("tokens"), py::arg("page_size"), py::arg("salt") = "",
      "Chained SHA-256 page keys of `tokens` (SGLang HiCache's): one 64-character lowercase hex "
      "string per whole page of `page_size` tokens. A non-empty `salt` (a tenant) seeds the "
      "chain. ValueError for a token outside [0, 2**32) or not an integer (a float, a bool), "
      "tokens that are not a list, tuple, range or 1-D integer array (a set, dict, str or "
      "bytes), or a page_size outside [1, 2**20].");
}

}  // namespace kvtier::python
