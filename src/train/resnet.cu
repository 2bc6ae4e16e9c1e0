// ResNet forward/backward: cuDNN convolutions (legacy API; algorithms measured by cudnnFind*, or
// the v7 heuristics' choice with --deterministic and under racecheck: Impl::measure_algorithms),
// cuDNN BatchNorm, cuDNN max pooling, and small kernels for global average pooling, the loss, and
// ReLU and residual add wherever cuDNN's batch norm does not fuse them (Impl::bn_fused). One
// conv+BN(+ReLU) is a ConvLayer; a block's last one also adds the shortcut before its ReLU. Its
// buffers hold what backward needs. Each convolution direction runs in NHWC, or on NCHW copies of
// its operands (Impl::conv_direction) where that measured faster.
#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "blas/matmul.h"
#include "core/dtype_dispatch.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "core/sanitizer.h"
#include "train/resnet.h"
#include "train/sync_batchnorm.h"

namespace gpulab::train {

namespace {

constexpr double kBnEpsilon = 1e-5;
constexpr double kBnMomentum = 0.1;  // torch's running-stat momentum
constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return unsigned(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, 65535 * 8)); }

cudnnDataType_t cudnn_type(core::DType dt) {
  switch (dt) {
    case core::DType::f32: return CUDNN_DATA_FLOAT;
    case core::DType::f16: return CUDNN_DATA_HALF;
    case core::DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: throw core::InputError("training precision must be fp32, tf32, fp16 or bf16");
  }
}

// ---- elementwise kernels (T: float, __half, __nv_bfloat16; arithmetic in float) ----

#define GRID_STRIDE(i, n) for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// The activation-sized kernels move 16 bytes per load and store: scalar ones reached about 60 %
// (masked copy) and 70 % (add + ReLU) of the copy bandwidth in a tf32 step on the H200, where they
// took a quarter of the GPU time. Their tensors are whole cudaMalloc buffers (256-byte aligned) of
// batch x H x W x C elements with C a multiple of 8 (check_gpu_width), so n is whole packs (see packs_of).
template <class T>
constexpr int kPack = 16 / int(sizeof(T));

template <class T>
struct alignas(16) Pack {
  T v[kPack<T>];
};

template <class T>
__device__ Pack<T> load_pack(const T* p, int64_t pack) {
  return reinterpret_cast<const Pack<T>*>(p)[pack];
}

template <class T>
__device__ void store_pack(T* p, int64_t pack, const Pack<T>& v) {
  reinterpret_cast<Pack<T>*>(p)[pack] = v;
}

// n elements at each pointer as packs of T (an internal error if they are not whole aligned packs).
template <class T>
int64_t packs_of(int64_t n, std::initializer_list<const void*> pointers) {
  bool whole = n % kPack<T> == 0;
  for (const void* p : pointers) whole = whole && reinterpret_cast<uintptr_t>(p) % sizeof(Pack<T>) == 0;
  if (!whole) throw core::Error("resnet: an activation of " + std::to_string(n) + " elements is not whole 16-byte packs");
  return n / kPack<T>;
}

template <class T>
__global__ void relu_kernel(T* x, int64_t packs) {
  GRID_STRIDE(i, packs) {
    Pack<T> v = load_pack(x, i);
    for (T& e : v.v) e = T(fmaxf(float(e), 0.f));
    store_pack(x, i, v);
  }
}

template <class T>
__global__ void add_relu_kernel(const T* a, const T* b, T* y, int64_t packs) {
  GRID_STRIDE(i, packs) {
    const Pack<T> pa = load_pack(a, i), pb = load_pack(b, i);
    Pack<T> v;
    for (int k = 0; k < kPack<T>; ++k) v.v[k] = T(fmaxf(float(pa.v[k]) + float(pb.v[k]), 0.f));
    store_pack(y, i, v);
  }
}

// d = y > 0 ? dy : 0 (ReLU backward from its output y; d may be dy).
template <class T>
__global__ void masked_copy_kernel(const T* y, const T* dy, T* d, int64_t packs) {
  GRID_STRIDE(i, packs) {
    const Pack<T> py = load_pack(y, i);
    Pack<T> v = load_pack(dy, i);
    for (int k = 0; k < kPack<T>; ++k)
      if (!(float(py.v[k]) > 0.f)) v.v[k] = T(0.f);
    store_pack(d, i, v);
  }
}

template <class T>
__global__ void cast_kernel(const float* src, T* dst, int64_t n) {
  GRID_STRIDE(i, n) dst[i] = T(src[i]);
}

template <class T>
__global__ void accumulate_kernel(float* dst, const T* src, int64_t n, int accumulate) {
  GRID_STRIDE(i, n) dst[i] = (accumulate ? dst[i] : 0.f) + float(src[i]);
}

// feat[n][c] = mean over h, w of x[n][h][w][c].
template <class T>
__global__ void avgpool_kernel(const T* x, float* feat, int batch, int hw, int channels) {
  GRID_STRIDE(i, int64_t(batch) * channels) {
    const int64_t n = i / channels, c = i % channels;
    float s = 0.f;
    for (int p = 0; p < hw; ++p) s += float(x[(n * hw + p) * channels + c]);
    feat[i] = s / float(hw);
  }
}

template <class T>
__global__ void avgpool_backward_kernel(const float* dfeat, T* dx, int batch, int hw, int channels) {
  GRID_STRIDE(i, int64_t(batch) * hw * channels) {
    const int64_t c = i % channels, n = i / (int64_t(hw) * channels);
    dx[i] = T(dfeat[n * channels + c] / float(hw));
  }
}

#undef GRID_STRIDE

template <class Op>
__device__ float block_reduce(float v, Op op) {
  __shared__ float part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  float r = part[0];
  for (int w = 1; w < kThreads / 32; ++w) r = op(r, part[w]);
  return r;
}

__global__ void add_bias_kernel(float* logits, const float* bias, int batch, int classes) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < int64_t(batch) * classes;
       i += int64_t(gridDim.x) * blockDim.x)
    logits[i] += bias[i % classes];
}

// One block per row: softmax cross-entropy with label smoothing s:
//   loss = lse - (1 - s) z_y - s/K sum_c z_c
//   dz_c = (softmax_c - (1 - s)[c == y] - s/K) * grad_weight * loss_scale
__global__ void loss_kernel(const float* logits, const int32_t* labels, int classes, float smoothing,
                            float grad_weight, const LossScaleState* scaler, float* dlogits, float* row_loss,
                            int* row_correct) {
  const float* z = logits + int64_t(blockIdx.x) * classes;
  float* dz = dlogits + int64_t(blockIdx.x) * classes;
  const int y = labels[blockIdx.x];
  float local_max = -FLT_MAX, local_sum_z = 0.f;
  for (int c = threadIdx.x; c < classes; c += blockDim.x) {
    local_max = fmaxf(local_max, z[c]);
    local_sum_z += z[c];
  }
  const float zmax = block_reduce(local_max, [](float a, float b) { return fmaxf(a, b); });
  const float sum_z = block_reduce(local_sum_z, [](float a, float b) { return a + b; });
  float local_exp = 0.f;
  for (int c = threadIdx.x; c < classes; c += blockDim.x) local_exp += expf(z[c] - zmax);
  const float lse = zmax + logf(block_reduce(local_exp, [](float a, float b) { return a + b; }));
  const float scale = grad_weight * (scaler ? scaler->scale : 1.f);
  const float off = smoothing / float(classes);
  for (int c = threadIdx.x; c < classes; c += blockDim.x)
    dz[c] = (expf(z[c] - lse) - (c == y ? 1.f - smoothing : 0.f) - off) * scale;
  if (threadIdx.x == 0) {
    row_loss[blockIdx.x] = lse - (1.f - smoothing) * z[y] - off * sum_z;
    row_correct[blockIdx.x] = z[y] >= zmax;
  }
}

// dbias[c] (+)= sum_n dz[n][c]
__global__ void bias_grad_kernel(const float* dz, float* dbias, int batch, int classes, int accumulate) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < classes; c += gridDim.x * blockDim.x) {
    float s = 0.f;
    for (int n = 0; n < batch; ++n) s += dz[int64_t(n) * classes + c];
    dbias[c] = (accumulate ? dbias[c] : 0.f) + s;
  }
}

// A convolution's operands: input x, filter w, output y. Each direction reads two and writes the
// third: forward y, backward-data x, backward-filter w.
enum ConvOperand { kConvX, kConvW, kConvY, kConvOperands };
using ConvData = std::array<const void*, kConvOperands>;

struct ConvDescs {  // one layout's descriptors of a convolution's operands
  cudnnTensorDescriptor_t x;
  cudnnFilterDescriptor_t w;
  cudnnTensorDescriptor_t y;
};

template <class Algo>
struct ConvAlgo {  // one direction's choice
  Algo algo{};
  ConvLayout layout = ConvLayout::nhwc;
};

struct ConvAlgos {
  ConvAlgo<cudnnConvolutionFwdAlgo_t> fwd;
  ConvAlgo<cudnnConvolutionBwdDataAlgo_t> bwd_data;
  ConvAlgo<cudnnConvolutionBwdFilterAlgo_t> bwd_filter;
};

// Measured times (ms) of transposing each operand into NCHW and out of it.
struct TransposeTimes {
  std::array<float, kConvOperands> to_nchw{}, from_nchw{};
  // What an NCHW direction adds to its convolution: its two inputs in, its result out.
  float direction(ConvOperand result) const {
    float ms = from_nchw[result];
    for (int o = 0; o < kConvOperands; ++o)
      if (o != result) ms += to_nchw[o];
    return ms;
  }
};

}  // namespace

struct ConvLayer {
  ConvSpec spec;
  int in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  cudnnTensorDescriptor_t x_desc{}, y_desc{}, bn_desc{};
  cudnnFilterDescriptor_t w_desc{};
  // NCHW twins of x_desc, w_desc and y_desc, and the filter as a plain tensor in each layout
  // (NHWC: [out][kh][kw][in]), for the directions that run in NCHW and their transposes.
  cudnnTensorDescriptor_t x_nchw{}, y_nchw{}, w_as_nhwc{}, w_as_nchw{};
  cudnnFilterDescriptor_t w_nchw{};
  cudnnConvolutionDescriptor_t conv_desc{};
  ConvAlgos algos;
  float *w = nullptr, *gamma = nullptr, *beta = nullptr;  // fp32 masters
  float *dw = nullptr, *dgamma = nullptr, *dbeta = nullptr;
  void* w_work = nullptr;  // the weights the conv reads (== w for fp32)
  int64_t w_count = 0;
  const void* in = nullptr;
  void* d_in = nullptr;  // null for the stem
  core::DeviceBuffer<std::byte> conv_out, out, d_out_own;
  void* d_out = nullptr;  // d_out_own, or for a block's last conv the residual's gradient (below)
  core::DeviceBuffer<float> save_mean, save_inv_var, run_mean, run_var;
  core::DeviceBuffer<std::byte> bn_reserve;  // cuDNN's Ex batch norm: kept from forward to backward
  // A block's last conv: its BN output plus `residual` (the block input, or the projection
  // shortcut's output), through a ReLU, is the block output `block_y`. Backward starts from the
  // block output's gradient `block_dy` and writes the masked gradient, which is the residual's too,
  // into d_out: the projection's d_out, or the block input's gradient, onto which the first conv
  // then adds.
  const void* residual = nullptr;
  void* block_y = nullptr;
  const void* block_dy = nullptr;

  ConvDescs descs(ConvLayout l) const {
    return l == ConvLayout::nchw ? ConvDescs{x_nchw, w_nchw, y_nchw} : ConvDescs{x_desc, w_desc, y_desc};
  }
  // Operand o as a plain tensor in layout l: what the transposes take.
  cudnnTensorDescriptor_t operand_desc(int o, ConvLayout l) const {
    const bool nchw = l == ConvLayout::nchw;
    return o == kConvX ? (nchw ? x_nchw : x_desc) : o == kConvY ? (nchw ? y_nchw : y_desc) : (nchw ? w_as_nchw : w_as_nhwc);
  }
  // How many of its directions run in NCHW (backward-data counts only where d_in is computed).
  int nchw_directions() const {
    return (algos.fwd.layout == ConvLayout::nchw) + (d_in && algos.bwd_data.layout == ConvLayout::nchw) +
           (algos.bwd_filter.layout == ConvLayout::nchw);
  }
};

struct Block {
  std::vector<int> convs;
  int shortcut = -1;
  // Output, its gradient, and the ReLU-masked gradient: the shortcut conv's d_out and, unfused,
  // the last conv's.
  core::DeviceBuffer<std::byte> y, dy, d_sum;
  int64_t elems = 0;
};

struct ResNet::Impl {
  ModelOptions opt;
  ResNetLayout layout;
  std::vector<ParamSpec> specs;
  int64_t total = 0;
  size_t elem = 4;
  cudnnHandle_t cudnn{};
  blas::Blas blas;
  core::DeviceBuffer<float> params, grads;
  core::DeviceBuffer<std::byte> work;  // working copies of conv weights (fp16/bf16 runs)
  core::DeviceBuffer<std::byte> dw_work, workspace;
  // The NCHW copies of each operand (ConvOperand) for the directions that run in NCHW, shared by
  // all layers (empty where none does).
  std::array<core::DeviceBuffer<std::byte>, kConvOperands> nchw_scratch;
  // Gradient of the conv output in backward, every layer in turn: BN backward writes it, the
  // weight and input gradients read it (a fused BN backward still reads the layer's output).
  core::DeviceBuffer<std::byte> d_conv;
  std::vector<ConvLayer> convs;
  std::vector<Block> blocks;
  cudnnPoolingDescriptor_t pool_desc{};
  cudnnTensorDescriptor_t pool_out_desc{};
  core::DeviceBuffer<std::byte> pool_out, d_pool_out;
  int final_hw = 0;
  float *fc_w = nullptr, *fc_b = nullptr, *fc_dw = nullptr, *fc_db = nullptr;
  core::DeviceBuffer<float> feat, dfeat, logits, dlogits, row_loss;
  core::DeviceBuffer<int> row_correct;
  int64_t batches_tracked = 0;
  std::function<void(int)> gradient_ready;
  SumOverRanks bn_sum;  // set: synchronised BatchNorm over bn_world ranks instead of cuDNN's
  int bn_world = 1;
  core::DeviceBuffer<double> bn_scratch;

  explicit Impl(const ModelOptions& o);
  ~Impl();
  void build_conv(ConvLayer& L, int in_h, int in_w);
  // Convolution algorithms chosen so far, by shape: in, out, kernel, stride, pad, input h and w,
  // whether the input gradient is computed.
  using ConvShapeKey = std::tuple<int, int, int, int, int, int, int, bool>;
  std::map<ConvShapeKey, ConvAlgos> chosen_algos;
  bool strict_fp32() const { return opt.dtype == core::DType::f32 && opt.math == core::MathMode::strict_fp32; }
  // Whether the convolutions' algorithms are timed (cudnnFind*, as torch's cudnn.benchmark) or
  // taken from cuDNN's heuristics. Heuristics where runs repeat bit for bit (--deterministic): their
  // choice does not depend on timing noise. And under compute-sanitizer's racecheck, which checks
  // every shared-memory access: timing runs every candidate algorithm of every shape, several
  // times, under an instrumentation that slows kernels unevenly, so its ranking would mean nothing.
  bool measure_algorithms() const { return !opt.deterministic && !core::under_racecheck(); }
  // The layouts whose algorithms are compared: the forced one; NHWC alone where nothing is timed
  // and for fp16/bf16 (cuDNN's fast kernels are NHWC there, and measuring NCHW as well would only
  // lengthen the start); else both.
  std::vector<ConvLayout> conv_layouts() const {
    if (opt.conv_layout) return {*opt.conv_layout};
    if (!measure_algorithms() || opt.dtype != core::DType::f32) return {ConvLayout::nhwc};
    return {ConvLayout::nhwc, ConvLayout::nchw};
  }
  template <class Perf, class Find>
  ConvAlgo<decltype(Perf::algo)> choose(const ConvLayer& L, int count, Find&& find, float transposes_ms,
                                        const char* what) const;
  TransposeTimes time_transposes(const ConvLayer& L);
  size_t operand_bytes(const ConvLayer& L, int o) const {
    const int64_t n = o == kConvX   ? int64_t(opt.batch) * L.spec.in * L.in_h * L.in_w
                      : o == kConvY ? int64_t(opt.batch) * L.spec.out * L.out_h * L.out_w
                                    : L.w_count;
    return size_t(n) * elem;
  }
  template <class Run>
  void conv_direction(const ConvLayer& L, ConvLayout layout, ConvOperand result, ConvData in, void* out, float beta,
                      cudaStream_t s, Run&& run);
  void conv_forward(ConvLayer& L, bool training, cudaStream_t s);
  void conv_backward(ConvLayer& L, bool accumulate, float beta_in, cudaStream_t s);
  SyncBatchNorm sync_bn(const ConvLayer& L) const {
    return {opt.dtype, int64_t(opt.batch) * L.out_h * L.out_w, L.spec.out, bn_world, kBnEpsilon, kBnMomentum,
            bn_scratch.get(), bn_sum};
  }
  void params_ready(int first, int count) {
    if (gradient_ready)
      for (int p = first; p < first + count; ++p) gradient_ready(p);
  }

  template <class F>
  void dispatch(F&& f) const { core::dispatch_activation(opt.dtype, std::forward<F>(f)); }
  // The persistent mode takes cuDNN's NHWC kernels for fp32, fp16 and bf16; both modes keep the
  // same statistics, so inference uses SPATIAL. Its reductions are only documented deterministic
  // for NCHW, so --deterministic keeps the general path, which is slow in NHWC (on the H200:
  // strict fp32 128 img/s; bf16 did not finish 100 steps of batch 256 in 40 s). Runs with the GPU
  // data pipeline have stalled in both modes, the loader thread inside nvJPEG's decode (see
  // docs/training.md, "Known problems").
  cudnnBatchNormMode_t bn_mode() const {
    return opt.deterministic ? CUDNN_BATCHNORM_SPATIAL : CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
  }
  // Batch norm goes through cuDNN's Ex entry points where cuDNN takes the layer: for NHWC they
  // run the NHWC kernels, where the plain ones took a generic path (7 ms a call on ResNet-50's
  // layers at batch 256 on the H200: 94 % of a training step). Their workspace shares the
  // convolutions'. If the Ex calls refuse any layer, every layer keeps the plain calls (bn_ex false).
  bool bn_ex = true;
  // Training batch norm with the layer's ReLU (and a block's residual add) fused into cuDNN's Ex
  // calls: CUDNN_BATCHNORM_OPS_BN_ACTIVATION for a conv with a ReLU, ..._BN_ADD_ACTIVATION for
  // a block's last conv, which then writes the block output itself. cuDNN documents these ops for
  // NHWC fp16 in the persistent mode only (TensorFlow's fused batch norm requires the same), so
  // bf16, fp32 and --deterministic keep the unfused path, and so does a model where cuDNN refuses
  // any layer's sizes, synchronised BatchNorm (set_batchnorm_sync), or ModelOptions::
  // fuse_bn_activation false. Chosen for the whole model: the unfused path applies the ReLUs, the
  // add and their backward masks with the small kernels above. Inference is always unfused.
  bool bn_fused = false;
  cudnnActivationDescriptor_t relu_desc{};
  cudnnBatchNormOps_t fused_ops(const ConvLayer& L) const {
    return L.residual ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                      : L.spec.relu ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION : CUDNN_BATCHNORM_OPS_BN;
  }
  // What cuDNN's training batch norm computes for this layer.
  cudnnBatchNormOps_t bn_ops(const ConvLayer& L) const { return bn_fused ? fused_ops(L) : CUDNN_BATCHNORM_OPS_BN; }
  // cuDNN's workspace (forward and backward) and reserve sizes for `ops` on this layer; false if
  // cuDNN refuses them.
  bool bn_ex_sizes(const ConvLayer& L, cudnnBatchNormOps_t ops, size_t& workspace_bytes, size_t& reserve_bytes) const {
    const bool act = ops != CUDNN_BATCHNORM_OPS_BN, add = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;
    const cudnnTensorDescriptor_t y = act ? L.y_desc : nullptr, z = add ? L.y_desc : nullptr;
    const cudnnActivationDescriptor_t a = act ? relu_desc : nullptr;
    size_t fwd = 0, bwd = 0;
    const bool ok =
        cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(cudnn, bn_mode(), ops, L.y_desc, z, L.y_desc,
                                                                 L.bn_desc, a, &fwd) == CUDNN_STATUS_SUCCESS &&
        cudnnGetBatchNormalizationBackwardExWorkspaceSize(cudnn, bn_mode(), ops, L.y_desc, y, L.y_desc, z, L.y_desc,
                                                          L.bn_desc, a, &bwd) == CUDNN_STATUS_SUCCESS &&
        cudnnGetBatchNormalizationTrainingExReserveSpaceSize(cudnn, bn_mode(), ops, a, L.y_desc, &reserve_bytes) ==
            CUDNN_STATUS_SUCCESS;
    workspace_bytes = std::max(fwd, bwd);
    return ok;
  }
};

ResNet::Impl::Impl(const ModelOptions& o) : opt(o), layout(resnet_layout(o.net)), specs(resnet_params(layout)) {
  cudnn_type(opt.dtype);  // rejects dtypes cuDNN training does not take
  check_gpu_width(opt.net.width);
  if (opt.batch < 1 || opt.image_size < 32) throw core::InputError("training needs batch >= 1 and images of at least 32x32");
  elem = core::dtype_size(opt.dtype);
  GPULAB_CHECK(cudnnCreate(&cudnn));
  // Our ReLU kernels turn NaN into 0 (fmaxf), and so does this one.
  GPULAB_CHECK(cudnnCreateActivationDescriptor(&relu_desc));
  GPULAB_CHECK(cudnnSetActivationDescriptor(relu_desc, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
  total = resnet_param_count(layout);
  params = core::DeviceBuffer<float>(size_t(total));
  grads = core::DeviceBuffer<float>(size_t(total));
  const std::vector<float> init = resnet_init(layout, opt.seed);
  GPULAB_CHECK(cudaMemcpy(params.get(), init.data(), init.size() * sizeof(float), cudaMemcpyHostToDevice));
  GPULAB_CHECK(cudaMemset(grads.get(), 0, grads.bytes()));
  if (opt.dtype != core::DType::f32) work = core::DeviceBuffer<std::byte>(size_t(total) * elem);

  // Parameter pointers, in resnet_params order (3 per conv, then fc weight and bias).
  convs.resize(layout.convs.size());
  int64_t off = 0;
  int64_t max_w = 0;
  for (size_t i = 0; i < layout.convs.size(); ++i) {
    ConvLayer& L = convs[i];
    L.spec = layout.convs[i];
    L.w_count = specs[3 * i].count;
    max_w = std::max(max_w, L.w_count);
    L.w = params.get() + off;
    L.dw = grads.get() + off;
    L.w_work = work.get() ? static_cast<void*>(work.get() + off * elem) : static_cast<void*>(L.w);
    off += L.w_count;
    L.gamma = params.get() + off, L.dgamma = grads.get() + off;
    off += L.spec.out;
    L.beta = params.get() + off, L.dbeta = grads.get() + off;
    off += L.spec.out;
  }
  fc_w = params.get() + off, fc_dw = grads.get() + off;
  off += int64_t(layout.classes) * layout.features;
  fc_b = params.get() + off, fc_db = grads.get() + off;
  if (opt.dtype != core::DType::f32) dw_work = core::DeviceBuffer<std::byte>(size_t(max_w) * elem);

  // Shapes, descriptors and buffers, in forward order.
  build_conv(convs[0], opt.image_size, opt.image_size);
  ConvLayer& stem = convs[0];
  GPULAB_CHECK(cudnnCreatePoolingDescriptor(&pool_desc));
  // Plain max-pool backward adds overlapping windows' gradients with atomics.
  GPULAB_CHECK(cudnnSetPooling2dDescriptor(pool_desc, opt.deterministic ? CUDNN_POOLING_MAX_DETERMINISTIC : CUDNN_POOLING_MAX,
                                           CUDNN_NOT_PROPAGATE_NAN, 3, 3, 1, 1, 2, 2));
  int pn, pc, ph, pw;
  GPULAB_CHECK(cudnnGetPooling2dForwardOutputDim(pool_desc, stem.y_desc, &pn, &pc, &ph, &pw));
  GPULAB_CHECK(cudnnCreateTensorDescriptor(&pool_out_desc));
  GPULAB_CHECK(cudnnSetTensor4dDescriptor(pool_out_desc, CUDNN_TENSOR_NHWC, cudnn_type(opt.dtype), pn, pc, ph, pw));
  pool_out = core::DeviceBuffer<std::byte>(size_t(pn) * pc * ph * pw * elem);
  d_pool_out = core::DeviceBuffer<std::byte>(pool_out.size());

  const void* in = pool_out.get();
  void* d_in = d_pool_out.get();
  int h = ph, w = pw;
  blocks.resize(layout.blocks.size());
  for (size_t b = 0; b < layout.blocks.size(); ++b) {
    Block& B = blocks[b];
    B.convs = layout.blocks[b].convs;
    B.shortcut = layout.blocks[b].shortcut;
    const void* x = in;
    int xh = h, xw = w;
    for (size_t j = 0; j < B.convs.size(); ++j) {
      ConvLayer& L = convs[B.convs[j]];
      L.in = x;
      L.d_in = j == 0 ? d_in : convs[B.convs[j - 1]].d_out;
      build_conv(L, xh, xw);
      x = L.out.get();
      xh = L.out_h, xw = L.out_w;
    }
    ConvLayer& last = convs[B.convs.back()];
    B.elems = int64_t(opt.batch) * last.out_h * last.out_w * last.spec.out;
    B.y = core::DeviceBuffer<std::byte>(size_t(B.elems) * elem);
    B.dy = core::DeviceBuffer<std::byte>(size_t(B.elems) * elem);
    // Unfused, the last conv's BN output gradient is the masked block-output gradient, which is
    // also the residual's: for an identity shortcut it is written straight into the block input's
    // gradient (the first conv's backward-data adds onto it only after the last conv's BN backward
    // has read it), for a projection into d_sum, the shortcut conv's output gradient.
    last.d_out_own.reset();
    last.d_out = d_in;
    last.block_y = B.y.get();
    last.block_dy = B.dy.get();
    last.residual = in;
    if (B.shortcut >= 0) {
      ConvLayer& S = convs[B.shortcut];
      S.in = in;
      S.d_in = d_in;
      build_conv(S, h, w);
      B.d_sum = core::DeviceBuffer<std::byte>(size_t(B.elems) * elem);
      S.d_out = B.d_sum.get();
      S.d_out_own.reset();
      last.residual = S.out.get();
      last.d_out = S.d_out;
    }
    in = B.y.get();
    d_in = B.dy.get();
    h = last.out_h, w = last.out_w;
  }
  final_hw = h * w;
  feat = core::DeviceBuffer<float>(size_t(opt.batch) * layout.features);
  dfeat = core::DeviceBuffer<float>(feat.size());
  logits = core::DeviceBuffer<float>(size_t(opt.batch) * layout.classes);
  dlogits = core::DeviceBuffer<float>(logits.size());
  row_loss = core::DeviceBuffer<float>(size_t(opt.batch));
  row_correct = core::DeviceBuffer<int>(size_t(opt.batch));

  // Which batch norm path runs (see bn_fused), then one workspace for the largest algorithm
  // chosen, and each layer's batch norm reserve.
  bn_fused = opt.fuse_bn_activation && opt.dtype == core::DType::f16 && bn_mode() == CUDNN_BATCHNORM_SPATIAL_PERSISTENT;
  size_t ws = 0, d_conv_bytes = 0;
  for (const auto& L : convs) {
    size_t unused_ws = 0, unused_reserve = 0;
    bn_ex = bn_ex && bn_ex_sizes(L, CUDNN_BATCHNORM_OPS_BN, unused_ws, unused_reserve);
    // cuDNN documents the fused add for channel counts that are multiples of 4 only.
    const bool channels_ok = fused_ops(L) != CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION || L.spec.out % 4 == 0;
    bn_fused = bn_fused && channels_ok && bn_ex_sizes(L, fused_ops(L), unused_ws, unused_reserve);
    d_conv_bytes = std::max(d_conv_bytes, L.conv_out.bytes());
  }
  bn_fused = bn_fused && bn_ex;
  core::log_debug("training batch norm: ", bn_fused ? "cuDNN with the ReLU and residual add fused"
                                        : bn_ex   ? "cuDNN (Ex), separate ReLU and add kernels"
                                                  : "cuDNN (plain), separate ReLU and add kernels");
  for (auto& L : convs) {
    size_t a = 0, b = 0, c = 0, bn_ws = 0, reserve = 0;
    const ConvAlgos& g = L.algos;
    const ConvDescs f = L.descs(g.fwd.layout), bd = L.descs(g.bwd_data.layout), bf = L.descs(g.bwd_filter.layout);
    GPULAB_CHECK(cudnnGetConvolutionForwardWorkspaceSize(cudnn, f.x, f.w, L.conv_desc, f.y, g.fwd.algo, &a));
    if (L.d_in)
      GPULAB_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(cudnn, bd.w, bd.y, L.conv_desc, bd.x, g.bwd_data.algo, &b));
    GPULAB_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnn, bf.x, bf.y, L.conv_desc, bf.w, g.bwd_filter.algo, &c));
    if (bn_ex) bn_ex_sizes(L, bn_ops(L), bn_ws, reserve);
    L.bn_reserve = core::DeviceBuffer<std::byte>(reserve);
    ws = std::max({ws, a, b, c, bn_ws});
  }
  workspace = core::DeviceBuffer<std::byte>(ws);
  core::zero_library_workspace_under_initcheck(workspace.get(), workspace.bytes());
  d_conv = core::DeviceBuffer<std::byte>(d_conv_bytes);
  // NCHW scratch for the largest layer with a direction in NCHW (each such direction uses all three).
  std::array<size_t, kConvOperands> scratch{};
  int directions = 0, nchw = 0;
  for (const auto& L : convs) {
    directions += L.d_in ? 3 : 2;
    nchw += L.nchw_directions();
    if (L.nchw_directions() == 0) continue;
    for (int o = 0; o < kConvOperands; ++o) scratch[o] = std::max(scratch[o], operand_bytes(L, o));
  }
  for (int o = 0; o < kConvOperands; ++o)
    if (scratch[o]) nchw_scratch[o] = core::DeviceBuffer<std::byte>(scratch[o]);
  core::log_debug("convolutions: ", nchw, " of ", directions,
                  " layer directions in NCHW (operands transposed there and back), the rest in NHWC");
  if (work.get()) {
    dispatch([&]<class T>() {
      cast_kernel<T><<<blocks_for(total), kThreads>>>(params.get(), reinterpret_cast<T*>(work.get()), total);
    });
    GPULAB_CHECK_LAUNCH();
  }
  GPULAB_CHECK(cudaDeviceSynchronize());
}

ResNet::Impl::~Impl() {
  for (auto& L : convs) {
    GPULAB_CHECK_NOTHROW(cudnnDestroyTensorDescriptor(L.x_desc));
    GPULAB_CHECK_NOTHROW(cudnnDestroyTensorDescriptor(L.y_desc));
    GPULAB_CHECK_NOTHROW(cudnnDestroyTensorDescriptor(L.bn_desc));
    GPULAB_CHECK_NOTHROW(cudnnDestroyFilterDescriptor(L.w_desc));
    for (auto d : {L.x_nchw, L.y_nchw, L.w_as_nhwc, L.w_as_nchw}) GPULAB_CHECK_NOTHROW(cudnnDestroyTensorDescriptor(d));
    GPULAB_CHECK_NOTHROW(cudnnDestroyFilterDescriptor(L.w_nchw));
    GPULAB_CHECK_NOTHROW(cudnnDestroyConvolutionDescriptor(L.conv_desc));
  }
  GPULAB_CHECK_NOTHROW(cudnnDestroyPoolingDescriptor(pool_desc));
  GPULAB_CHECK_NOTHROW(cudnnDestroyTensorDescriptor(pool_out_desc));
  GPULAB_CHECK_NOTHROW(cudnnDestroyActivationDescriptor(relu_desc));
  GPULAB_CHECK_NOTHROW(cudnnDestroy(cudnn));
}

namespace {

// The fastest measured algorithm (cudnnFind*, as torch's cudnn.benchmark; the heuristic first
// choice with --deterministic) that succeeds, fits the workspace limit, for strict fp32 does not
// use tensor cores (which would round inputs to TF32), and when asked is deterministic. (cuDNN's
// heuristic first choice for strict fp32 NHWC backward-data was a direct kernel taking 82 ms a
// call on the H200: 72 % of a step.) Null if none qualifies.
template <class Perf>
const Perf* pick(const Perf* perfs, int count, size_t limit, bool strict, bool deterministic) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = perfs[i];
    if (p.status != CUDNN_STATUS_SUCCESS || p.memory > limit) continue;
    if (deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
    if (strict && (p.mathType == CUDNN_TENSOR_OP_MATH || p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)) continue;
    return &p;
  }
  return nullptr;
}

}  // namespace

// One direction's algorithm and layout. find(descs, count, perfs, &got) lists cuDNN's algorithms
// for one layout's descriptors (measured, or in the heuristics' order); each layout's time is its
// pick's, plus `transposes_ms` for NCHW, and the faster wins (NHWC on a tie).
template <class Perf, class Find>
ConvAlgo<decltype(Perf::algo)> ResNet::Impl::choose(const ConvLayer& L, int count, Find&& find, float transposes_ms,
                                                    const char* what) const {
  ConvAlgo<decltype(Perf::algo)> best;
  float best_ms = INFINITY;
  bool found = false;
  size_t least_workspace = SIZE_MAX;  // of the algorithms that qualify but for the workspace limit
  for (const ConvLayout layout : conv_layouts()) {
    std::vector<Perf> perfs(static_cast<size_t>(count));
    int got = 0;
    GPULAB_CHECK(find(L.descs(layout), count, perfs.data(), &got));
    for (int i = 0; i < got; ++i)
      if (pick(&perfs[size_t(i)], 1, SIZE_MAX, strict_fp32(), opt.deterministic))
        least_workspace = std::min(least_workspace, perfs[size_t(i)].memory);
    const Perf* p = pick(perfs.data(), got, opt.workspace_limit, strict_fp32(), opt.deterministic);
    if (!p) continue;
    const float ms = p->time + (layout == ConvLayout::nchw ? transposes_ms : 0.f);
    if (!found || ms < best_ms) best = {p->algo, layout}, best_ms = ms, found = true;
  }
  if (!found) {
    const auto mib = [](size_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; };
    throw core::Error(std::string("cuDNN offers no ") + what +
                      " algorithm for this convolution within the workspace limit (" + mib(opt.workspace_limit) + ")" +
                      (strict_fp32() ? ", without tensor cores" : "") +
                      (opt.deterministic ? ", deterministic" : "") +
                      (least_workspace != SIZE_MAX ? "; the least such an algorithm needs is " + mib(least_workspace) +
                                                         " (--conv-workspace)"
                                                   : ""));
  }
  return best;
}

// Each transpose of L's operands timed with CUDA events on the handle's stream (the mean of a
// few after a warm-up), on scratch whose contents do not matter.
TransposeTimes ResNet::Impl::time_transposes(const ConvLayer& L) {
  constexpr int kReps = 3;
  size_t most = 0;
  for (int o = 0; o < kConvOperands; ++o) most = std::max(most, operand_bytes(L, o));
  core::DeviceBuffer<std::byte> from(most), to(most);
  cudaStream_t stream{};
  GPULAB_CHECK(cudnnGetStream(cudnn, &stream));
  // Defined values to move: compute-sanitizer's initcheck flagged the transposes' reads of a
  // never-written `from` (session 25), and timing should not depend on what the allocator left.
  GPULAB_CHECK(cudaMemsetAsync(from.get(), 0, most, stream));
  core::EventTimer timer(stream);
  const float one = 1.f, zero = 0.f;
  TransposeTimes t;
  for (int o = 0; o < kConvOperands; ++o)
    for (const bool into : {true, false}) {
      const cudnnTensorDescriptor_t src = L.operand_desc(o, into ? ConvLayout::nhwc : ConvLayout::nchw),
                                    dst = L.operand_desc(o, into ? ConvLayout::nchw : ConvLayout::nhwc);
      for (int r = 0; r <= kReps; ++r) {
        if (r == 1) timer.start();  // after the warm-up
        GPULAB_CHECK(cudnnTransformTensor(cudnn, &one, src, from.get(), &zero, dst, to.get()));
      }
      (into ? t.to_nchw : t.from_nchw)[size_t(o)] = timer.stop() / kReps;
    }
  return t;
}

void ResNet::Impl::build_conv(ConvLayer& L, int in_h, int in_w) {
  const cudnnDataType_t dt = cudnn_type(opt.dtype);
  const ConvSpec& s = L.spec;
  L.in_h = in_h, L.in_w = in_w;
  GPULAB_CHECK(cudnnCreateTensorDescriptor(&L.x_desc));
  GPULAB_CHECK(cudnnSetTensor4dDescriptor(L.x_desc, CUDNN_TENSOR_NHWC, dt, opt.batch, s.in, in_h, in_w));
  GPULAB_CHECK(cudnnCreateFilterDescriptor(&L.w_desc));
  GPULAB_CHECK(cudnnSetFilter4dDescriptor(L.w_desc, dt, CUDNN_TENSOR_NHWC, s.out, s.in, s.kernel, s.kernel));
  GPULAB_CHECK(cudnnCreateConvolutionDescriptor(&L.conv_desc));
  GPULAB_CHECK(cudnnSetConvolution2dDescriptor(L.conv_desc, s.pad, s.pad, s.stride, s.stride, 1, 1,
                                               CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  // FMA: no tensor cores at all; DEFAULT allows TF32 for fp32 data; TENSOR_OP for fp16/bf16.
  const cudnnMathType_t math = strict_fp32()                   ? CUDNN_FMA_MATH
                               : opt.dtype == core::DType::f32 ? CUDNN_DEFAULT_MATH
                                                               : CUDNN_TENSOR_OP_MATH;
  GPULAB_CHECK(cudnnSetConvolutionMathType(L.conv_desc, math));
  int n, c, h, w;
  GPULAB_CHECK(cudnnGetConvolution2dForwardOutputDim(L.conv_desc, L.x_desc, L.w_desc, &n, &c, &h, &w));
  L.out_h = h, L.out_w = w;
  GPULAB_CHECK(cudnnCreateTensorDescriptor(&L.y_desc));
  GPULAB_CHECK(cudnnSetTensor4dDescriptor(L.y_desc, CUDNN_TENSOR_NHWC, dt, n, c, h, w));
  GPULAB_CHECK(cudnnCreateTensorDescriptor(&L.bn_desc));
  GPULAB_CHECK(cudnnDeriveBNTensorDescriptor(L.bn_desc, L.y_desc, CUDNN_BATCHNORM_SPATIAL));
  for (auto* d : {&L.x_nchw, &L.y_nchw, &L.w_as_nhwc, &L.w_as_nchw}) GPULAB_CHECK(cudnnCreateTensorDescriptor(d));
  GPULAB_CHECK(cudnnSetTensor4dDescriptor(L.x_nchw, CUDNN_TENSOR_NCHW, dt, opt.batch, s.in, in_h, in_w));
  GPULAB_CHECK(cudnnSetTensor4dDescriptor(L.y_nchw, CUDNN_TENSOR_NCHW, dt, n, c, h, w));
  GPULAB_CHECK(cudnnSetTensor4dDescriptor(L.w_as_nhwc, CUDNN_TENSOR_NHWC, dt, s.out, s.in, s.kernel, s.kernel));
  GPULAB_CHECK(cudnnSetTensor4dDescriptor(L.w_as_nchw, CUDNN_TENSOR_NCHW, dt, s.out, s.in, s.kernel, s.kernel));
  GPULAB_CHECK(cudnnCreateFilterDescriptor(&L.w_nchw));
  GPULAB_CHECK(cudnnSetFilter4dDescriptor(L.w_nchw, dt, CUDNN_TENSOR_NCHW, s.out, s.in, s.kernel, s.kernel));

  // Layers of one shape (most of a stage's blocks) share the choice: measuring is the slow part.
  const ConvShapeKey key{s.in, s.out, s.kernel, s.stride, s.pad, in_h, in_w, L.d_in != nullptr};
  if (const auto hit = chosen_algos.find(key); hit != chosen_algos.end()) {
    L.algos = hit->second;
  } else {
    const bool measure = measure_algorithms();
    // Measuring runs every algorithm: on our own operands, zeroed, with a workspace of the limit
    // (the Ex calls). The plain cudnnFind* calls allocate theirs and leave them unwritten, which
    // compute-sanitizer's initcheck flagged (session 27). y stands for dy in the backward passes,
    // whose outputs (dx into x, dw into w) become the next pass's inputs.
    core::DeviceBuffer<std::byte> x, w, y, workspace;
    if (measure) {
      cudaStream_t stream{};
      GPULAB_CHECK(cudnnGetStream(cudnn, &stream));
      x = core::DeviceBuffer<std::byte>(operand_bytes(L, kConvX));
      w = core::DeviceBuffer<std::byte>(operand_bytes(L, kConvW));
      y = core::DeviceBuffer<std::byte>(operand_bytes(L, kConvY));
      workspace = core::DeviceBuffer<std::byte>(opt.workspace_limit);
      core::zero_library_workspace_under_initcheck(workspace.get(), workspace.bytes());
      for (auto* b : {&x, &w, &y}) GPULAB_CHECK(cudaMemsetAsync(b->get(), 0, b->bytes(), stream));
    }
    // An NCHW direction pays for its transposes: timed when it competes with NHWC.
    const TransposeTimes moves = conv_layouts().size() > 1 ? time_transposes(L) : TransposeTimes{};
    L.algos.fwd = choose<cudnnConvolutionFwdAlgoPerf_t>(
        L, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
        [&](const ConvDescs& d, int count, auto* perfs, int* got) {
          return measure ? cudnnFindConvolutionForwardAlgorithmEx(cudnn, d.x, x.get(), d.w, w.get(), L.conv_desc, d.y,
                                                                  y.get(), count, got, perfs, workspace.get(),
                                                                  workspace.bytes())
                         : cudnnGetConvolutionForwardAlgorithm_v7(cudnn, d.x, d.w, L.conv_desc, d.y, count, got, perfs);
        },
        moves.direction(kConvY), "forward");
    if (L.d_in)  // the stem needs no input gradient
      L.algos.bwd_data = choose<cudnnConvolutionBwdDataAlgoPerf_t>(
          L, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
          [&](const ConvDescs& d, int count, auto* perfs, int* got) {
            return measure ? cudnnFindConvolutionBackwardDataAlgorithmEx(cudnn, d.w, w.get(), d.y, y.get(), L.conv_desc,
                                                                         d.x, x.get(), count, got, perfs,
                                                                         workspace.get(), workspace.bytes())
                           : cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnn, d.w, d.y, L.conv_desc, d.x, count, got,
                                                                         perfs);
          },
          moves.direction(kConvX), "backward-data");
    L.algos.bwd_filter = choose<cudnnConvolutionBwdFilterAlgoPerf_t>(
        L, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
        [&](const ConvDescs& d, int count, auto* perfs, int* got) {
          return measure ? cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnn, d.x, x.get(), d.y, y.get(),
                                                                           L.conv_desc, d.w, w.get(), count, got, perfs,
                                                                           workspace.get(), workspace.bytes())
                         : cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnn, d.x, d.y, L.conv_desc, d.w, count, got,
                                                                         perfs);
        },
        moves.direction(kConvW), "backward-filter");
    chosen_algos.emplace(key, L.algos);
  }

  const size_t bytes = operand_bytes(L, kConvY);
  L.conv_out = core::DeviceBuffer<std::byte>(bytes);
  L.out = core::DeviceBuffer<std::byte>(bytes);
  L.d_out_own = core::DeviceBuffer<std::byte>(bytes);
  L.d_out = L.d_out_own.get();
  for (auto* b : {&L.save_mean, &L.save_inv_var, &L.run_mean, &L.run_var}) *b = core::DeviceBuffer<float>(size_t(c));
  GPULAB_CHECK(cudaMemset(L.run_mean.get(), 0, L.run_mean.bytes()));
  const std::vector<float> ones(size_t(c), 1.f);
  GPULAB_CHECK(cudaMemcpy(L.run_var.get(), ones.data(), L.run_var.bytes(), cudaMemcpyHostToDevice));
}

// One direction of L's convolution on s (cuDNN's stream): run(descs, in, out, beta) calls cuDNN on
// the two operands it reads, in[kConvX|W|Y], and writes `out` (operand `result`) as its result +
// beta * out. In NCHW, run gets NCHW copies of its inputs in scratch and writes into scratch, which
// is transposed onto `out` with the same beta.
template <class Run>
void ResNet::Impl::conv_direction(const ConvLayer& L, ConvLayout layout, ConvOperand result, ConvData in, void* out,
                                  float beta, cudaStream_t s, Run&& run) {
  if (layout == ConvLayout::nhwc) {
    if (beta == 0.f) core::zero_library_result_under_initcheck(out, operand_bytes(L, result), s);
    return run(L.descs(layout), in, out, &beta);
  }
  const float one = 1.f, zero = 0.f;
  for (int o = 0; o < kConvOperands; ++o) {
    if (o == result) continue;
    void* copy = nchw_scratch[size_t(o)].get();
    GPULAB_CHECK(cudnnTransformTensor(cudnn, &one, L.operand_desc(o, ConvLayout::nhwc), in[size_t(o)], &zero,
                                      L.operand_desc(o, ConvLayout::nchw), copy));
    in[size_t(o)] = copy;
  }
  void* result_nchw = nchw_scratch[result].get();
  core::zero_library_result_under_initcheck(result_nchw, operand_bytes(L, result), s);
  run(L.descs(layout), in, result_nchw, &zero);
  GPULAB_CHECK(cudnnTransformTensor(cudnn, &one, L.operand_desc(result, ConvLayout::nchw), result_nchw, &beta,
                                    L.operand_desc(result, ConvLayout::nhwc), out));
}

// Conv, BN, and the ReLU (after adding the shortcut, for a block's last conv; the shortcut's
// conv runs first). Output: L.out, or the block output for a block's last conv.
void ResNet::Impl::conv_forward(ConvLayer& L, bool training, cudaStream_t s) {
  core::wait_under_racecheck(s);  // a layer's few launches at a time: what racecheck holds stays small
  const float one = 1.f, zero = 0.f;
  conv_direction(L, L.algos.fwd.layout, kConvY, {L.in, L.w_work, nullptr}, L.conv_out.get(), 0.f, s,
                 [&](const ConvDescs& d, const ConvData& in, void* y, const float* beta) {
                   GPULAB_CHECK(cudnnConvolutionForward(cudnn, &one, d.x, in[kConvX], d.w, in[kConvW], L.conv_desc,
                                                        L.algos.fwd.algo, workspace.get(), workspace.bytes(), beta,
                                                        d.y, y));
                 });
  const cudnnBatchNormOps_t ops = training ? bn_ops(L) : CUDNN_BATCHNORM_OPS_BN;
  if (training && bn_sum) {
    sync_batchnorm_forward(sync_bn(L), L.conv_out.get(), L.out.get(), L.gamma, L.beta, L.run_mean.get(), L.run_var.get(),
                           L.save_mean.get(), L.save_inv_var.get(), s);
  } else if (training && bn_ex) {
    const bool add = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;
    GPULAB_CHECK(cudnnBatchNormalizationForwardTrainingEx(
        cudnn, bn_mode(), ops, &one, &zero, L.y_desc, L.conv_out.get(), add ? L.y_desc : nullptr,
        add ? L.residual : nullptr, L.y_desc, add ? L.block_y : L.out.get(), L.bn_desc, L.gamma, L.beta, kBnMomentum,
        L.run_mean.get(), L.run_var.get(), kBnEpsilon, L.save_mean.get(), L.save_inv_var.get(),
        ops == CUDNN_BATCHNORM_OPS_BN ? nullptr : relu_desc, workspace.get(), workspace.bytes(), L.bn_reserve.get(),
        L.bn_reserve.bytes()));
  } else if (training) {
    GPULAB_CHECK(cudnnBatchNormalizationForwardTraining(
        cudnn, bn_mode(), &one, &zero, L.y_desc, L.conv_out.get(), L.y_desc, L.out.get(), L.bn_desc,
        L.gamma, L.beta, kBnMomentum, L.run_mean.get(), L.run_var.get(), kBnEpsilon, L.save_mean.get(),
        L.save_inv_var.get()));
  } else {
    GPULAB_CHECK(cudnnBatchNormalizationForwardInference(cudnn, CUDNN_BATCHNORM_SPATIAL, &one, &zero, L.y_desc,
                                                         L.conv_out.get(), L.y_desc, L.out.get(), L.bn_desc, L.gamma,
                                                         L.beta, L.run_mean.get(), L.run_var.get(), kBnEpsilon));
  }
  if (ops != CUDNN_BATCHNORM_OPS_BN) return;  // fused: cuDNN applied the add and the ReLU
  const int64_t n = int64_t(opt.batch) * L.out_h * L.out_w * L.spec.out;
  if (L.residual) {
    dispatch([&]<class T>() {
      const int64_t packs = packs_of<T>(n, {L.out.get(), L.residual, L.block_y});
      add_relu_kernel<T><<<blocks_for(packs), kThreads, 0, s>>>(reinterpret_cast<const T*>(L.out.get()),
                                                                reinterpret_cast<const T*>(L.residual),
                                                                reinterpret_cast<T*>(L.block_y), packs);
    });
    GPULAB_CHECK_LAUNCH();
  } else if (L.spec.relu) {
    dispatch([&]<class T>() {
      const int64_t packs = packs_of<T>(n, {L.out.get()});
      relu_kernel<T><<<blocks_for(packs), kThreads, 0, s>>>(reinterpret_cast<T*>(L.out.get()), packs);
    });
    GPULAB_CHECK_LAUNCH();
  }
}

// From the gradient of this layer's output (d_out, or block_dy for a block's last conv): ReLU
// mask, BN backward (into dgamma/dbeta; for a block's last conv also the shortcut's gradient into
// d_out), weight gradient, and the input gradient into d_in scaled by beta_in (0: write,
// 1: add).
void ResNet::Impl::conv_backward(ConvLayer& L, bool accumulate, float beta_in, cudaStream_t s) {
  core::wait_under_racecheck(s);  // as in conv_forward
  const int64_t n = int64_t(opt.batch) * L.out_h * L.out_w * L.spec.out;
  const cudnnBatchNormOps_t ops = bn_ops(L);
  if (ops == CUDNN_BATCHNORM_OPS_BN && (L.residual || L.spec.relu)) {
    // Unfused: the ReLU's mask, from its output. A block's last conv masks the block output's
    // gradient into d_out, which is also the residual's gradient; others mask in place.
    const void* y = L.residual ? L.block_y : L.out.get();
    const void* dy = L.residual ? L.block_dy : L.d_out;
    dispatch([&]<class T>() {
      const int64_t packs = packs_of<T>(n, {y, dy, L.d_out});
      masked_copy_kernel<T><<<blocks_for(packs), kThreads, 0, s>>>(
          static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(L.d_out), packs);
    });
    GPULAB_CHECK_LAUNCH();
  }
  const float one = 1.f, zero = 0.f, param_beta = accumulate ? 1.f : 0.f;
  void* dc = d_conv.get();
  if (bn_sum) {
    sync_batchnorm_backward(sync_bn(L), L.conv_out.get(), L.d_out, dc, L.gamma, L.dgamma, L.dbeta, accumulate,
                            L.save_mean.get(), L.save_inv_var.get(), s);
  } else if (bn_ex) {
    // Fused: cuDNN masks with the layer's output itself (the block output for ADD_ACTIVATION,
    // from whose gradient it starts, and it writes the residual's gradient too).
    const bool act = ops != CUDNN_BATCHNORM_OPS_BN, add = ops == CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION;
    GPULAB_CHECK(cudnnBatchNormalizationBackwardEx(
        cudnn, bn_mode(), ops, &one, &zero, &one, &param_beta, L.y_desc, L.conv_out.get(), act ? L.y_desc : nullptr,
        add ? L.block_y : act ? L.out.get() : nullptr, L.y_desc, add ? L.block_dy : L.d_out, add ? L.y_desc : nullptr,
        add ? L.d_out : nullptr, L.y_desc, dc, L.bn_desc, L.gamma, L.beta, L.dgamma, L.dbeta, kBnEpsilon,
        L.save_mean.get(), L.save_inv_var.get(), act ? relu_desc : nullptr, workspace.get(), workspace.bytes(),
        L.bn_reserve.get(), L.bn_reserve.bytes()));
  } else {
    GPULAB_CHECK(cudnnBatchNormalizationBackward(cudnn, bn_mode(), &one, &zero, &one, &param_beta,
                                                 L.y_desc, L.conv_out.get(), L.y_desc, L.d_out, L.y_desc, dc,
                                                 L.bn_desc, L.gamma, L.dgamma, L.dbeta, kBnEpsilon, L.save_mean.get(),
                                                 L.save_inv_var.get()));
  }
  // fp16/bf16 weight gradients go through dw_work, then are added into the fp32 gradients.
  const bool f32 = opt.dtype == core::DType::f32;
  conv_direction(L, L.algos.bwd_filter.layout, kConvW, {L.in, nullptr, dc}, f32 ? static_cast<void*>(L.dw) : dw_work.get(),
                 f32 ? param_beta : 0.f, s, [&](const ConvDescs& d, const ConvData& in, void* dw, const float* beta) {
                   GPULAB_CHECK(cudnnConvolutionBackwardFilter(cudnn, &one, d.x, in[kConvX], d.y, in[kConvY],
                                                               L.conv_desc, L.algos.bwd_filter.algo, workspace.get(),
                                                               workspace.bytes(), beta, d.w, dw));
                 });
  if (!f32) {
    dispatch([&]<class T>() {
      accumulate_kernel<T><<<blocks_for(L.w_count), kThreads, 0, s>>>(L.dw, reinterpret_cast<const T*>(dw_work.get()),
                                                                       L.w_count, accumulate);
    });
    GPULAB_CHECK_LAUNCH();
  }
  params_ready(3 * int(&L - convs.data()), 3);  // weight, BN weight, BN bias
  if (L.d_in)
    conv_direction(L, L.algos.bwd_data.layout, kConvX, {nullptr, L.w_work, dc}, L.d_in, beta_in, s,
                   [&](const ConvDescs& d, const ConvData& in, void* dx, const float* beta) {
                     GPULAB_CHECK(cudnnConvolutionBackwardData(cudnn, &one, d.w, in[kConvW], d.y, in[kConvY],
                                                               L.conv_desc, L.algos.bwd_data.algo, workspace.get(),
                                                               workspace.bytes(), beta, d.x, dx));
                   });
}

ResNet::ResNet(const ModelOptions& opt) : impl_(std::make_unique<Impl>(opt)) {}
ResNet::~ResNet() = default;

void ResNet::forward(const void* images, bool training, cudaStream_t s) {
  Impl& m = *impl_;
  GPULAB_CHECK(cudnnSetStream(m.cudnn, s));
  if (training) ++m.batches_tracked;
  m.convs[0].in = images;
  m.conv_forward(m.convs[0], training, s);
  const float one = 1.f, zero = 0.f;
  GPULAB_CHECK(cudnnPoolingForward(m.cudnn, m.pool_desc, &one, m.convs[0].y_desc, m.convs[0].out.get(), &zero,
                                   m.pool_out_desc, m.pool_out.get()));
  for (auto& B : m.blocks) {
    if (B.shortcut >= 0) m.conv_forward(m.convs[B.shortcut], training, s);  // the last conv adds its output
    for (int c : B.convs) m.conv_forward(m.convs[c], training, s);        // the last writes B.y
  }
  const Block& last = m.blocks.back();
  const int N = m.opt.batch, C = m.layout.features, K = m.layout.classes;
  m.dispatch([&]<class T>() {
    avgpool_kernel<T><<<blocks_for(int64_t(N) * C), kThreads, 0, s>>>(reinterpret_cast<const T*>(last.y.get()),
                                                                      m.feat.get(), N, m.final_hw, C);
  });
  GPULAB_CHECK_LAUNCH();
  // logits = feat · fc_wᵀ + fc_b
  const blas::MatmulTypes f32{core::DType::f32, core::DType::f32, core::DType::f32, m.opt.math};
  m.blas.matmul({N, K, C, false, true}, f32, m.feat.get(), m.fc_w, m.logits.get(), s);
  add_bias_kernel<<<blocks_for(int64_t(N) * K), kThreads, 0, s>>>(m.logits.get(), m.fc_b, N, K);
  GPULAB_CHECK_LAUNCH();
}

void ResNet::backward(const int32_t* labels, float loss_weight, bool accumulate, const LossScaleState* scaler,
                      cudaStream_t s) {
  Impl& m = *impl_;
  GPULAB_CHECK(cudnnSetStream(m.cudnn, s));
  const int N = m.opt.batch, C = m.layout.features, K = m.layout.classes;
  loss_kernel<<<N, kThreads, 0, s>>>(m.logits.get(), labels, K, m.opt.label_smoothing, loss_weight / float(N),
                                     scaler, m.dlogits.get(), m.row_loss.get(), m.row_correct.get());
  GPULAB_CHECK_LAUNCH();
  const blas::MatmulTypes f32{core::DType::f32, core::DType::f32, core::DType::f32, m.opt.math};
  // fc_dw[K×C] (+)= dlogitsᵀ · feat ; dfeat[N×C] = dlogits · fc_w
  m.blas.matmul({K, C, N, true, false}, f32, m.dlogits.get(), m.feat.get(), m.fc_dw, s, 1.f, accumulate ? 1.f : 0.f);
  bias_grad_kernel<<<blocks_for(K), kThreads, 0, s>>>(m.dlogits.get(), m.fc_db, N, K, accumulate);
  GPULAB_CHECK_LAUNCH();
  m.params_ready(3 * int(m.convs.size()), 2);  // fc weight and bias
  m.blas.matmul({N, C, K, false, false}, f32, m.dlogits.get(), m.fc_w, m.dfeat.get(), s);
  Block& last = m.blocks.back();
  m.dispatch([&]<class T>() {
    avgpool_backward_kernel<T><<<blocks_for(last.elems), kThreads, 0, s>>>(m.dfeat.get(), reinterpret_cast<T*>(last.dy.get()),
                                                                           N, m.final_hw, C);
  });
  GPULAB_CHECK_LAUNCH();
  for (auto it = m.blocks.rbegin(); it != m.blocks.rend(); ++it) {
    Block& B = *it;
    // The last conv's backward (first here) writes the shortcut's gradient: for an identity that is
    // the block input's gradient, onto which the first conv adds; for a projection its d_out, and
    // the projection then adds onto the first conv's input gradient.
    for (auto c = B.convs.rbegin(); c != B.convs.rend(); ++c) {
      const bool onto_identity = B.shortcut < 0 && *c == B.convs.front();
      m.conv_backward(m.convs[*c], accumulate, onto_identity ? 1.f : 0.f, s);
    }
    if (B.shortcut >= 0) m.conv_backward(m.convs[B.shortcut], accumulate, 1.f, s);
  }
  ConvLayer& stem = m.convs[0];
  const float one = 1.f, zero = 0.f;
  GPULAB_CHECK(cudnnPoolingBackward(m.cudnn, m.pool_desc, &one, m.pool_out_desc, m.pool_out.get(), m.pool_out_desc,
                                    m.d_pool_out.get(), stem.y_desc, stem.out.get(), &zero, stem.y_desc, stem.d_out));
  m.conv_backward(stem, accumulate, 0.f, s);
}

float ResNet::last_loss(cudaStream_t s, int rows) const {
  std::vector<float> h(size_t(impl_->opt.batch));
  copy_row_losses(h.data(), s);
  GPULAB_CHECK(cudaStreamSynchronize(s));
  return mean_loss(h.data(), impl_->opt.batch, rows);
}

void ResNet::copy_row_losses(float* host, cudaStream_t s) const {
  GPULAB_CHECK(cudaMemcpyAsync(host, impl_->row_loss.get(), impl_->row_loss.bytes(), cudaMemcpyDeviceToHost, s));
}

float ResNet::mean_loss(const float* row_losses, int batch, int rows) {
  if (rows < 0 || rows > batch) rows = batch;
  double sum = 0;
  for (int i = 0; i < rows; ++i) sum += row_losses[i];
  return float(sum / double(std::max(rows, 1)));
}

int ResNet::last_correct(cudaStream_t s, int rows) const {
  std::vector<int> h(size_t(impl_->opt.batch));
  GPULAB_CHECK(cudaMemcpyAsync(h.data(), impl_->row_correct.get(), impl_->row_correct.bytes(), cudaMemcpyDeviceToHost, s));
  GPULAB_CHECK(cudaStreamSynchronize(s));
  if (rows < 0 || rows > int(h.size())) rows = int(h.size());
  int n = 0;
  for (int i = 0; i < rows; ++i) n += h[size_t(i)];
  return n;
}

void ResNet::score(const int32_t* labels, cudaStream_t s) {
  Impl& m = *impl_;
  loss_kernel<<<m.opt.batch, kThreads, 0, s>>>(m.logits.get(), labels, m.layout.classes, m.opt.label_smoothing, 0.f,
                                               nullptr, m.dlogits.get(), m.row_loss.get(), m.row_correct.get());
  GPULAB_CHECK_LAUNCH();
}

void ResNet::set_gradient_ready_hook(std::function<void(int)> hook) { impl_->gradient_ready = std::move(hook); }

void ResNet::set_batchnorm_sync(SumOverRanks sum_over_ranks, int world) {
  Impl& m = *impl_;
  int widest = 0;
  for (const auto& L : m.convs) widest = std::max(widest, L.spec.out);
  m.bn_scratch = core::DeviceBuffer<double>(2 * size_t(widest));
  m.bn_sum = std::move(sum_over_ranks);
  m.bn_world = world;
  m.bn_fused = false;  // our synchronised BatchNorm, then our ReLU and add kernels
  core::log_debug("training batch norm: synchronised over ", world, " ranks, separate ReLU and add kernels");
}
const float* ResNet::logits() const { return impl_->logits.get(); }
float* ResNet::params() { return impl_->params.get(); }
float* ResNet::grads() { return impl_->grads.get(); }
int64_t ResNet::param_count() const { return impl_->total; }
const std::vector<ParamSpec>& ResNet::param_specs() const { return impl_->specs; }
const ModelOptions& ResNet::options() const { return impl_->opt; }

std::vector<ParamTensor> ResNet::optimizer_params() {
  Impl& m = *impl_;
  std::vector<ParamTensor> out;
  int64_t off = 0;
  for (size_t i = 0; i < m.specs.size(); ++i) {
    const bool conv_weight = i < 3 * m.convs.size() && i % 3 == 0;
    void* copy = conv_weight && m.work.get() ? static_cast<void*>(m.work.get() + off * m.elem) : nullptr;
    out.push_back({m.params.get() + off, m.grads.get() + off, m.specs[i].count, m.specs[i].decay, copy});
    off += m.specs[i].count;
  }
  return out;
}

std::vector<GradView> ResNet::gradient_views() const {
  return {{impl_->grads.get(), impl_->total}};  // one packed buffer
}

void ResNet::sync_working_copy(cudaStream_t s) {
  Impl& m = *impl_;
  if (!m.work.get()) return;
  m.dispatch([&]<class T>() {
    cast_kernel<T><<<blocks_for(m.total), kThreads, 0, s>>>(m.params.get(), reinterpret_cast<T*>(m.work.get()), m.total);
  });
  GPULAB_CHECK_LAUNCH();
}

std::vector<RunningStats> ResNet::running_stats() {
  std::vector<RunningStats> out;
  for (auto& L : impl_->convs) out.push_back({L.run_mean.get(), L.run_var.get(), L.spec.out});
  return out;
}

int64_t ResNet::batches_tracked() const { return impl_->batches_tracked; }
bool ResNet::fused_bn_activation() const { return impl_->bn_fused; }
int ResNet::nchw_conv_directions() const {
  int n = 0;
  for (const auto& L : impl_->convs) n += L.nchw_directions();
  return n;
}
void ResNet::set_batches_tracked(int64_t n) { impl_->batches_tracked = n; }

}  // namespace gpulab::train
