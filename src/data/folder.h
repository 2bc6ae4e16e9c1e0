// ImageNet-layout folders: `ROOT/<class>/*.JPEG`, classes sorted by name as torchvision's
// ImageFolder does, so label i means the same class in both.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace gpulab::data {

struct Sample {
  std::filesystem::path path;
  int32_t label = 0;
};

struct ImageFolder {
  std::filesystem::path root;
  std::vector<std::string> classes;  // sorted; index = label
  std::vector<Sample> samples;       // sorted by class, then file name
};

// Lists `root`. Throws core::InputError when root is missing, has no class folders, or holds no
// JPEG files (.jpg/.jpeg, any case): training on an empty dataset is a user mistake.
ImageFolder scan_image_folder(const std::filesystem::path& root);

// The folder to train on: DIR/train when it exists (ImageNet layout), else DIR itself.
std::filesystem::path train_split(const std::filesystem::path& dir);

}  // namespace gpulab::data
