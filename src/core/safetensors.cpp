#include "core/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace gpulab::core {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Headers above this are refused: real ones are kilobytes to a few megabytes.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

[[noreturn]] void bad_file(const fs::path& path, const std::string& problem) {
  throw InputError(path.string() + ": " + problem);
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

TensorInfo parse_tensor_entry(const fs::path& path, const std::string& name, const json& entry,
                              uint64_t data_bytes) {
  auto bad = [&](const std::string& what) { bad_file(path, "tensor '" + name + "': " + what); };
  if (!entry.is_object()) bad("entry is not an object");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(key)) bad(std::string("missing \"") + key + "\"");

  TensorInfo t;
  t.name = name;
  if (!entry["dtype"].is_string()) bad("dtype is not a string");
  const auto dtype_text = entry["dtype"].get<std::string>();
  const auto dtype = dtype_from_safetensors_name(dtype_text);
  if (!dtype) bad("unknown dtype '" + dtype_text + "'");
  t.dtype = *dtype;

  if (!entry["shape"].is_array()) bad("shape is not an array");
  for (const auto& dim : entry["shape"]) {
    if (!dim.is_number_unsigned()) bad("shape has a dimension that is not a non-negative integer");
    t.shape.push_back(static_cast<int64_t>(dim.get<uint64_t>()));
  }

  const auto& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    bad("data_offsets is not a pair of non-negative integers");
  t.data_begin = offsets[0].get<uint64_t>();
  t.data_end = offsets[1].get<uint64_t>();
  if (t.data_begin > t.data_end) bad("data_offsets begin after they end");
  if (t.data_end > data_bytes)
    bad("data_offsets [" + std::to_string(t.data_begin) + ", " + std::to_string(t.data_end) +
        ") run past the end of the data (" + std::to_string(data_bytes) + " bytes; file truncated?)");

  uint64_t expected = dtype_size(t.dtype);
  for (int64_t dim : t.shape)
    if (!checked_mul(expected, static_cast<uint64_t>(dim), &expected)) bad("shape overflows");
  if (expected != t.bytes())
    bad("shape x dtype is " + std::to_string(expected) + " bytes but data_offsets span " +
        std::to_string(t.bytes()));
  return t;
}

}  // namespace

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

MappedFile::MappedFile(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) bad_file(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    bad_file(path, "not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      bad_file(path, std::string("cannot map: ") + std::strerror(errno));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

SafetensorsFile::SafetensorsFile(const fs::path& path)
    : path_(path), map_(std::make_unique<MappedFile>(path)) {
  const auto bytes = map_->bytes();
  if (bytes.size() < 8)
    bad_file(path, "truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the 8-byte header length");
  header_bytes_ = read_le64(bytes.data());
  if (header_bytes_ > bytes.size() - 8)
    bad_file(path, "header length " + std::to_string(header_bytes_) + " runs past the end of the file (" +
                       std::to_string(bytes.size()) + " bytes; truncated?)");
  if (header_bytes_ > kMaxHeaderBytes)
    bad_file(path, "header length " + std::to_string(header_bytes_) + " is implausibly large");
  const auto* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  json header = json::parse(header_begin, header_begin + header_bytes_, nullptr, false);
  if (header.is_discarded()) bad_file(path, "header is not valid JSON");
  if (!header.is_object()) bad_file(path, "header is not a JSON object");

  const uint64_t data_bytes = bytes.size() - 8 - header_bytes_;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) bad_file(path, "__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) bad_file(path, "__metadata__ value for '" + key + "' is not a string");
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    tensors_.push_back(parse_tensor_entry(path, name, entry, data_bytes));
  }

  // Byte ranges must not overlap (empty tensors take no bytes and may sit anywhere).
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : tensors_)
    if (t.bytes() > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->data_begin < b->data_begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->data_begin < by_offset[i - 1]->data_end)
      bad_file(path, "tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name +
                         "' have overlapping data_offsets");
  std::sort(tensors_.begin(), tensors_.end(),
            [](const auto& a, const auto& b) { return a.data_begin < b.data_begin; });
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

std::span<const uint8_t> SafetensorsFile::data(const TensorInfo& tensor) const {
  return map_->bytes().subspan(8 + header_bytes_ + tensor.data_begin, tensor.bytes());
}

Checkpoint::Checkpoint(const fs::path& path) {
  fs::path file = path;
  if (fs::is_directory(path)) {
    if (fs::exists(path / "model.safetensors.index.json"))
      file = path / "model.safetensors.index.json";
    else if (fs::exists(path / "model.safetensors"))
      file = path / "model.safetensors";
    else {
      std::vector<fs::path> found;
      for (const auto& e : fs::directory_iterator(path)) {
        const auto name = e.path().filename().string();
        if (name.ends_with(".safetensors.index.json") || name.ends_with(".safetensors")) found.push_back(e.path());
      }
      std::sort(found.begin(), found.end());
      if (found.size() != 1)
        throw InputError(path.string() + ": expected model.safetensors or model.safetensors.index.json in this folder");
      file = found[0];
    }
  } else if (!fs::exists(path)) {
    throw InputError(path.string() + ": no such file or folder");
  }

  if (file.string().ends_with(".json")) {
    std::ifstream in(file);
    json index = json::parse(in, nullptr, false);
    if (index.is_discarded() || !index.is_object()) bad_file(file, "index is not valid JSON");
    if (!index.contains("weight_map") || !index["weight_map"].is_object())
      bad_file(file, "index has no \"weight_map\" object");
    std::map<std::string, std::vector<std::string>> names_by_shard;
    for (const auto& [name, shard] : index["weight_map"].items()) {
      if (!shard.is_string()) bad_file(file, "weight_map entry for '" + name + "' is not a file name");
      const auto shard_name = shard.get<std::string>();
      if (shard_name.find('/') != std::string::npos || shard_name == "..")
        bad_file(file, "weight_map names shard '" + shard_name + "' outside the checkpoint folder");
      names_by_shard[shard_name].push_back(name);
    }
    for (const auto& [shard_name, names] : names_by_shard) {
      const auto shard_path = file.parent_path() / shard_name;
      std::error_code ec;  // a name the file system refuses (too long, ...) is the index's fault
      if (!fs::exists(shard_path, ec))
        bad_file(file, "shard '" + shard_name + "' named by the index " + (ec ? "cannot be read: " + ec.message() : "is missing"));
      shards_.push_back(std::make_unique<SafetensorsFile>(shard_path));
      for (const auto& name : names) {
        const TensorInfo* info = shards_.back()->find(name);
        if (!info) bad_file(shard_path, "tensor '" + name + "' named by the index is not in this shard");
        entries_.push_back({info, shards_.back().get()});
      }
    }
  } else {
    shards_.push_back(std::make_unique<SafetensorsFile>(file));
    for (const auto& t : shards_.back()->tensors()) entries_.push_back({&t, shards_.back().get()});
  }
  // Names are unique: each comes from the keys of one JSON object (the index's weight_map, or the
  // single file's header), so find() can search the sorted entries.
  std::sort(entries_.begin(), entries_.end(),
            [](const Entry& a, const Entry& b) { return a.info->name < b.info->name; });
}

const Checkpoint::Entry* Checkpoint::find(const std::string& name) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                             [](const Entry& e, const std::string& n) { return e.info->name < n; });
  return it != entries_.end() && it->info->name == name ? &*it : nullptr;
}

const Checkpoint::Entry& Checkpoint::at(const std::string& name) const {
  const Entry* e = find(name);
  if (!e) throw InputError("checkpoint has no tensor '" + name + "'");
  return *e;
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& e : entries_) n += e.info->bytes();
  return n;
}

uint64_t Checkpoint::total_params() const {
  uint64_t n = 0;
  for (const auto& e : entries_) n += e.info->numel();
  return n;
}

void write_file_atomic(const fs::path& path, std::span<const uint8_t> contents) {
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot write " + tmp.string() + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string reason = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error("cannot write " + path.string() + ": " + reason);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error("cannot write " + path.string() + ": " + reason);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error("cannot rename " + tmp.string() + " to " + path.string() + ": " + reason);
  }
}

void write_file_atomic(const fs::path& path, const std::string& contents) {
  write_file_atomic(path, std::span(reinterpret_cast<const uint8_t*>(contents.data()), contents.size()));
}

void write_safetensors(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t expected = dtype_size(t.dtype);
    for (int64_t d : t.shape) expected *= static_cast<uint64_t>(d);
    if (expected != t.bytes.size())
      throw Error("write_safetensors: tensor '" + t.name + "' has " + std::to_string(t.bytes.size()) +
                  " bytes, its shape and dtype need " + std::to_string(expected));
    header[t.name] = {{"dtype", dtype_safetensors_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + expected}}};
    offset += expected;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // data stays 8-byte aligned
  std::vector<uint8_t> out(8 + header_text.size() + offset);
  const uint64_t n = header_text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header_text.data(), header_text.size());
  uint8_t* data = out.data() + 8 + header_text.size();
  for (const auto& t : tensors) {
    std::memcpy(data, t.bytes.data(), t.bytes.size());
    data += t.bytes.size();
  }
  write_file_atomic(path, out);
}

}  // namespace gpulab::core
