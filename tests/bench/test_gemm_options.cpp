// `gpulab bench gemm --only/--sizes`: names and sizes are checked before any device is needed.
#include <gtest/gtest.h>

#include "bench/suite.h"
#include "core/error.h"

using namespace gpulab;
using namespace gpulab::bench;

TEST(GemmOptions, KnownVariantsAndSizesPass) {
  Options opt;
  EXPECT_NO_THROW(check_gemm_options(opt));
  opt.only = {"cublaslt_bf16", "ladder4_mma_sync_bf16", "ladder4_mma_sync_fp16", "ladder5_wgmma_bf16"};
  opt.sizes = {8192, 1};
  EXPECT_NO_THROW(check_gemm_options(opt));
}

TEST(GemmOptions, UnknownVariantNamesTheValidOnes) {
  Options opt;
  opt.only = {"cublaslt_bf16", "ladder4_mma_sync_bf16_8192"};  // a row name with its size is not a variant
  try {
    check_gemm_options(opt);
    FAIL() << "expected InputError";
  } catch (const core::InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'ladder4_mma_sync_bf16_8192'"), std::string::npos) << what;
    EXPECT_NE(what.find("ladder5_wgmma_bf16"), std::string::npos) << what;
  }
}

TEST(GemmOptions, SizesMustBePositive32Bit) {
  Options opt;
  opt.sizes = {8192, 0};
  EXPECT_THROW(check_gemm_options(opt), core::InputError);
  opt.sizes = {int64_t(1) << 31};
  EXPECT_THROW(check_gemm_options(opt), core::InputError);
}

// bench llm's fp8 figure goes through the same check, before any device is needed.
TEST(GemmOptions, MeasuringAnUnknownVariantIsAnInputError) {
  EXPECT_THROW(measure_gemm_variant("cublaslt_fp8e4m3_rowwise_8192", 8192), core::InputError);
  EXPECT_THROW(measure_gemm_variant("cublaslt_fp8e4m3_rowwise", 0), core::InputError);
}
