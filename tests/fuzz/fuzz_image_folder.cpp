// Dataset folder scanning over a file tree the input describes, one entry per line:
//   `a/b.JPEG` a file, `a/b/` a folder, `a/l -> target` a symbolic link (target verbatim: it may
//   dangle, loop or point outside). Names are any bytes but '/', NUL and newline; `.` and `..`
//   components are skipped so the tree stays inside the scratch folder (a link target may leave it).
// scan_image_folder lists it or refuses with an InputError; a listing is sorted, labelled in
// range, and names only JPEG files of the class folders.
#include <algorithm>
#include <filesystem>
#include <string>

#include "data/folder.h"
#include "fuzz/fuzz_util.h"

using namespace gpulab;
namespace fs = std::filesystem;

namespace {

// Builds the described tree under `root`; at most 64 entries, 4 levels deep.
void build_tree(const fs::path& root, std::string_view text) {
  int entries = 0;
  for (size_t pos = 0; pos < text.size() && entries < 64; ++entries) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string line(text.substr(pos, end - pos));
    pos = end + 1;
    if (line.find('\0') != std::string::npos) continue;
    std::string target;
    if (const size_t arrow = line.find(" -> "); arrow != std::string::npos) {
      target = line.substr(arrow + 4);
      line.resize(arrow);
    }
    const bool is_dir = !line.empty() && line.back() == '/';
    fs::path rel;
    int depth = 0;
    for (size_t b = 0; b < line.size();) {
      size_t e = line.find('/', b);
      if (e == std::string::npos) e = line.size();
      const std::string part = line.substr(b, e - b);
      b = e + 1;
      if (part.empty() || part == "." || part == ".." || part.size() > 64) continue;
      rel /= part;
      ++depth;
    }
    if (rel.empty() || depth > 4) continue;
    std::error_code ec;
    const fs::path p = root / rel;
    fs::create_directories(p.parent_path(), ec);
    if (!target.empty()) fs::create_symlink(target, p, ec);
    else if (is_dir) fs::create_directories(p, ec);
    else fuzz::write_bytes(p, "");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path root = fuzz::scratch_dir() / "dataset";
  std::error_code ec;
  fs::remove_all(root, ec);
  fs::create_directories(root);
  build_tree(root, fuzz::as_text(data, size));
  fuzz::refuse_or_pass([&] {
    const data::ImageFolder f = data::scan_image_folder(root);
    fuzz::check(std::is_sorted(f.classes.begin(), f.classes.end()), "classes are sorted");
    fuzz::check(!f.samples.empty(), "a listing has samples");
    for (size_t i = 0; i < f.samples.size(); ++i) {
      const auto& s = f.samples[i];
      fuzz::check(s.label >= 0 && static_cast<size_t>(s.label) < f.classes.size(), "labels index the classes");
      fuzz::check(s.path.parent_path() == root / f.classes[s.label], "a sample sits in its class folder");
      if (i > 0) fuzz::check(f.samples[i - 1].label < s.label || (f.samples[i - 1].label == s.label && f.samples[i - 1].path < s.path),
                             "samples are sorted by class, then name");
    }
  });
  return 0;
}
