#include "data/folder.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace gpulab::data {

namespace fs = std::filesystem;

namespace {

bool is_jpeg_name(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg";
}

}  // namespace

ImageFolder scan_image_folder(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    throw core::InputError(root.string() + ": not a folder (expected ROOT/<class>/*.JPEG)");
  ImageFolder out{root, {}, {}};
  // An entry that cannot be read (a symbolic link loop, no permission) is the user's to fix.
  try {
    for (const auto& entry : fs::directory_iterator(root)) {
      if (entry.is_directory()) out.classes.push_back(entry.path().filename().string());
    }
    std::sort(out.classes.begin(), out.classes.end());
    if (out.classes.empty())
      throw core::InputError(root.string() + ": no class folders (expected ROOT/<class>/*.JPEG; make one with "
                             "`gpulab dataset make`)");
    for (size_t c = 0; c < out.classes.size(); ++c) {
      std::vector<fs::path> files;
      for (const auto& entry : fs::directory_iterator(root / out.classes[c]))
        if (entry.is_regular_file() && is_jpeg_name(entry.path())) files.push_back(entry.path());
      std::sort(files.begin(), files.end());
      for (auto& f : files) out.samples.push_back({std::move(f), static_cast<int32_t>(c)});
    }
  } catch (const fs::filesystem_error& e) {
    throw core::InputError(e.path1().string() + ": cannot read (" + e.code().message() + ")");
  }
  if (out.samples.empty())
    throw core::InputError(root.string() + ": " + std::to_string(out.classes.size()) +
                           " class folders but no .JPEG/.jpg files in them");
  return out;
}

fs::path train_split(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir / "train", ec) ? dir / "train" : dir;
}

}  // namespace gpulab::data
