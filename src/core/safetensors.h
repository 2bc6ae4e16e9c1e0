// safetensors reading (mmap, header validated) and writing (atomic), for single files and
// for checkpoint folders sharded through `*.safetensors.index.json`.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}
// then the data; offsets are relative to the first byte after the header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace gpulab::core {

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t data_begin = 0;  // relative to the data section
  uint64_t data_end = 0;
  uint64_t numel() const;
  uint64_t bytes() const { return data_end - data_begin; }
};

// A read-only memory map of one file; unmapped on destruction.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::span<const uint8_t> bytes() const { return {data_, size_}; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// One .safetensors file. The constructor validates the whole header and throws InputError
// naming the file and the problem.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in file order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;
  std::span<const uint8_t> data(const TensorInfo& tensor) const;
  uint64_t header_bytes() const { return header_bytes_; }

 private:
  std::filesystem::path path_;
  std::unique_ptr<MappedFile> map_;
  uint64_t header_bytes_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint: a .safetensors file, a `*.safetensors.index.json`, or a folder
// holding either (`model.safetensors` or `model.safetensors.index.json`).
class Checkpoint {
 public:
  explicit Checkpoint(const std::filesystem::path& path);
  struct Entry {
    const TensorInfo* info;
    const SafetensorsFile* shard;
  };
  const std::vector<Entry>& tensors() const { return entries_; }  // sorted by name
  const Entry* find(const std::string& name) const;
  const Entry& at(const std::string& name) const;  // throws InputError when missing
  std::span<const uint8_t> data(const Entry& entry) const { return entry.shard->data(*entry.info); }
  const std::vector<std::unique_ptr<SafetensorsFile>>& shards() const { return shards_; }
  uint64_t total_bytes() const;
  uint64_t total_params() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::vector<Entry> entries_;
};

// A tensor to write: the bytes must be shape × dtype size long.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
};

// Writes a .safetensors file through a temporary name and a rename, so a failure never leaves
// a partial file at `path`. Tensors are stored in the given order.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes `contents` to `path` through a temporary file in the same folder and a rename.
void write_file_atomic(const std::filesystem::path& path, std::span<const uint8_t> contents);
void write_file_atomic(const std::filesystem::path& path, const std::string& contents);

}  // namespace gpulab::core
