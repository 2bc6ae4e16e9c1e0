// gpulab dataset make|scan|load: write a synthetic ImageNet-layout JPEG folder; check one; time an
// input pipeline on one.
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/command.h"
#include "cli/table.h"
#include "core/progress.h"
#include "core/result.h"
#include "data/dataset.h"
#include "data/load_rate.h"

namespace gpulab::cli {

namespace {

using nlohmann::json;

int default_threads() { return std::max(1, int(std::thread::hardware_concurrency())); }

struct MakeCli {
  std::string dir;
  data::MakeOptions opt;
  std::string kind = "shapes";
};

struct ScanCli {
  std::string dir;
  int threads = default_threads();
  bool json_output = false;
  bool strict = false;
};

struct LoadCli {
  std::string dir;
  data::LoadRateOptions opt;
  std::string decode = "auto";
  std::string precision = "fp16";
  std::string json_path;
};

// The bar is made on the first call, once the total is known.
data::ProgressFn progress_to(std::unique_ptr<core::ProgressBar>& bar, const char* label) {
  return [&bar, label](int64_t done, int64_t total) {
    if (!bar) bar = std::make_unique<core::ProgressBar>(label, uint64_t(total));
    bar->set(uint64_t(done));
  };
}

int run_make(MakeCli& m) {
  m.opt.kind = m.kind == "noise" ? data::SyntheticKind::noise : data::SyntheticKind::shapes;
  std::unique_ptr<core::ProgressBar> bar;
  const data::MakeReport r = data::make_dataset(m.dir, m.opt, progress_to(bar, "dataset make"));
  bar.reset();
  std::cout << "wrote " << r.files << " JPEG files (" << human_bytes(uint64_t(r.bytes)) << ") to " << m.dir
            << ": " << m.opt.classes << " classes, " << m.opt.train_images << " train + " << m.opt.val_images
            << " val images per class, " << m.opt.width << "x" << m.opt.height << ", kind " << m.kind << "\n";
  return 0;
}

int run_scan(const ScanCli& s) {
  std::unique_ptr<core::ProgressBar> bar;
  const data::ScanReport r = data::scan_dataset(s.dir, s.threads, progress_to(bar, "dataset scan"));
  bar.reset();
  const int status = s.strict && !r.corrupt.empty() ? core::kExitBadInput : 0;
  if (s.json_output) {
    json out = {{"root", r.root}, {"splits", json::array()}, {"corrupt", json::array()},
                {"decode", {{"images", r.decoded}, {"bytes", r.bytes}, {"megapixels", r.megapixels},
                            {"seconds", r.seconds}, {"threads", r.threads},
                            {"images_per_second", r.images_per_second()}}}};
    for (const auto& sp : r.splits) {
      json classes = json::array();
      for (size_t c = 0; c < sp.classes.size(); ++c) classes.push_back({{"name", sp.classes[c]}, {"images", sp.counts[c]}});
      out["splits"].push_back({{"name", sp.name}, {"images", sp.images}, {"classes", classes}});
    }
    for (const auto& c : r.corrupt) out["corrupt"].push_back({{"path", c.path}, {"problem", c.problem}});
    std::cout << out.dump(2) << "\n";
    return status;
  }
  Table t({"split", "classes", "images", "min/class", "max/class"});
  for (const auto& sp : r.splits) {
    const auto [lo, hi] = std::minmax_element(sp.counts.begin(), sp.counts.end());
    t.add({sp.name, std::to_string(sp.classes.size()), std::to_string(sp.images), std::to_string(*lo),
           std::to_string(*hi)});
  }
  t.print(std::cout);
  std::cout << "\ndecoded " << r.decoded << " images (" << human_bytes(uint64_t(r.bytes)) << ", "
            << format_double(r.megapixels, 1) << " MP) in " << format_double(r.seconds, 2) << " s on " << r.threads
            << " threads: " << format_double(r.images_per_second(), 0) << " img/s, "
            << format_double(r.seconds > 0 ? r.megapixels / r.seconds : 0, 1) << " MP/s\n";
  if (r.corrupt.empty()) {
    std::cout << "no corrupt files\n";
  } else {
    std::cout << r.corrupt.size() << " corrupt file" << (r.corrupt.size() == 1 ? "" : "s")
              << " (training skips them):\n";
    for (const auto& c : r.corrupt) std::cout << "  " << c.problem << "\n";
  }
  return status;
}

int run_load(LoadCli& l) {
  l.opt.decode = l.decode == "cpu" ? data::DecodeBackend::cpu
                 : l.decode == "nvjpeg" ? data::DecodeBackend::nvjpeg
                                        : data::DecodeBackend::automatic;
  l.opt.out = l.precision == "fp32" ? core::DType::f32 : l.precision == "bf16" ? core::DType::bf16 : core::DType::f16;
  const data::LoadRate r = data::measure_load_rate(l.dir, l.opt);
  std::cout << l.opt.pipeline << " pipeline: " << format_double(r.images_per_second, 0) << " img/s (" << r.images
            << " images of " << l.opt.size << "x" << l.opt.size << " " << l.precision << " in "
            << format_double(r.seconds, 2) << " s, batch " << l.opt.batch << ", " << l.opt.threads << " threads)\n";
  if (!r.decoder.empty())
    std::cout << "decoder: " << r.decoder << " (images by hardware " << r.decode.hardware << ", GPU hybrid "
              << r.decode.gpu_hybrid << ", CPU " << r.decode.cpu << ")\n"
              << "loader thread per batch: " << format_double(r.build_ms, 2) << " ms, of which reading/checking files "
              << format_double(r.read_ms, 2) << " ms, decode calls " << format_double(r.decode_ms, 2) << " ms\n";
  if (r.corrupt_skipped) std::cout << r.corrupt_skipped << " corrupt images skipped\n";
  if (!l.json_path.empty()) {
    core::ResultLog log(core::stamp_gpu(0));
    json params = {{"pipeline", l.opt.pipeline}, {"batch", l.opt.batch}, {"batches", l.opt.batches},
                   {"threads", l.opt.threads}, {"size", l.opt.size}, {"dtype", l.precision}, {"data", l.dir},
                   {"seconds", r.seconds}, {"corrupt_skipped", r.corrupt_skipped}};
    if (!r.decoder.empty()) {
      params["decoder"] = {{"name", r.decoder}, {"hardware", r.decode.hardware},
                           {"gpu_hybrid", r.decode.gpu_hybrid}, {"cpu", r.decode.cpu}};
      params["loader_thread_ms_per_batch"] = {{"all", r.build_ms}, {"read", r.read_ms}, {"decode", r.decode_ms}};
    }
    log.add({"data", "load_" + l.opt.pipeline, "throughput", r.images_per_second, "img/s", std::nullopt, params});
    log.write(l.json_path);
  }
  return 0;
}

}  // namespace

void add_dataset_command(CLI::App& app, Runner& run) {
  auto* sub = app.add_subcommand("dataset", "Write a synthetic ImageNet-layout JPEG folder, scan one, or time an input pipeline on one");
  sub->require_subcommand(1);

  auto m = std::make_shared<MakeCli>();
  auto* make = sub->add_subcommand("make", "Write DIR/train/<class>/*.JPEG and DIR/val/<class>/*.JPEG");
  make->add_option("dir", m->dir, "Folder to create (must not exist or be empty)")->required();
  make->add_option("--classes", m->opt.classes, "Number of classes")->capture_default_str();
  make->add_option("--images", m->opt.train_images, "Training images per class")->capture_default_str();
  make->add_option("--val", m->opt.val_images, "Validation images per class")->capture_default_str();
  make->add_option("--kind", m->kind, "shapes: class = shape x colour, learnable; noise: pipeline load only")
      ->check(CLI::IsMember({"shapes", "noise"}))
      ->capture_default_str();
  make->add_option("--width", m->opt.width, "Image width")->capture_default_str();
  make->add_option("--height", m->opt.height, "Image height")->capture_default_str();
  make->add_option("--quality", m->opt.quality, "JPEG quality")->check(CLI::Range(1, 100))->capture_default_str();
  make->add_option("--seed", m->opt.seed, "Seed: the same seed writes the same bytes")->capture_default_str();
  m->opt.threads = default_threads();
  make->add_option("--threads", m->opt.threads, "Encoder threads")->capture_default_str();
  make->footer("Example:\n  gpulab dataset make /tmp/shapes --classes 10 --images 100");
  make->callback([&run, m] { run = [m] { return run_make(*m); }; });

  auto s = std::make_shared<ScanCli>();
  auto* scan = sub->add_subcommand("scan", "Classes, image counts, corrupt files and CPU decode rate of a folder");
  scan->add_option("dir", s->dir, "DIR with train/ and val/, or a single ROOT/<class>/*.JPEG folder")->required();
  scan->add_option("--threads", s->threads, "Decoder threads")->capture_default_str();
  scan->add_flag("--json", s->json_output, "Print JSON instead of a table");
  scan->add_flag("--strict", s->strict, "Exit 2 when any file is corrupt");
  scan->footer("Example:\n  gpulab dataset scan /data/imagenet --strict\n"
               "Every JPEG is decoded; corrupt ones are listed (exit 2 with --strict).");
  scan->callback([&run, s] { run = [s] { return run_scan(*s); }; });

  auto l = std::make_shared<LoadCli>();
  l->opt.threads = default_threads();
  auto* load = sub->add_subcommand("load", "Input pipeline speed alone: training batches per second, no model");
  load->add_option("dir", l->dir, "DIR with train/, or a single ROOT/<class>/*.JPEG folder")->required();
  load->add_option("--pipeline", l->opt.pipeline, "cpu (TurboJPEG + CPU augmentation) or gpu (GPU decode + CUDA augmentation)")
      ->check(CLI::IsMember({"cpu", "gpu"}))
      ->capture_default_str();
  load->add_option("--decode", l->decode, "gpu pipeline decoder: auto (nvJPEG when built with it), cpu, nvjpeg")
      ->check(CLI::IsMember({"auto", "cpu", "nvjpeg"}))
      ->capture_default_str();
  load->add_option("--batch", l->opt.batch, "Images per batch")->capture_default_str();
  load->add_option("--batches", l->opt.batches, "Timed batches (after 3 untimed)")->capture_default_str();
  load->add_option("--threads", l->opt.threads, "CPU threads (cpu: decode + augment; gpu: file reading)")->capture_default_str();
  load->add_option("--image-size", l->opt.size, "Crop size")->capture_default_str();
  load->add_option("--precision", l->precision, "Output type: fp32, fp16, bf16")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))
      ->capture_default_str();
  load->add_option("--json", l->json_path, "Write the result as JSON");
  load->footer("Example:\n  gpulab dataset load /tmp/shapes --pipeline gpu --batch 256 --batches 40");
  load->callback([&run, l] { run = [l] { return run_load(*l); }; });
}

}  // namespace gpulab::cli
