# gpulab on NVIDIA's CUDA 13 + cuDNN image. Build:  docker build -t gpulab .
# Run:  docker run --gpus all gpulab info
# The build stage runs the same scripts as the README's quick start.

FROM nvidia/cuda:13.0.0-cudnn-devel-ubuntu24.04 AS build
WORKDIR /src
COPY . .
RUN scripts/install_deps.sh \
 && scripts/build.sh -DGPULAB_BUILD_TESTS=OFF \
 && cmake --install build --prefix /opt/gpulab \
 && mkdir -p /opt/gpulab/lib \
 && cp -L /usr/local/cuda/lib64/libcupti.so.13 /opt/gpulab/lib/

# Runtime: the CUDA runtime image (cudart, cuBLAS, NCCL, cuDNN) plus gpulab and what it links.
FROM nvidia/cuda:13.0.0-cudnn-runtime-ubuntu24.04
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libpcre2-8-0 libturbojpeg \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/gpulab /opt/gpulab
ENV PATH=/opt/gpulab/bin:$PATH \
    LD_LIBRARY_PATH=/opt/gpulab/lib:$LD_LIBRARY_PATH \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
ENTRYPOINT ["gpulab"]
CMD ["info"]
