// launch_gap (bench only): what one more kernel launch costs on the GPU timeline when kernels depend
// on each other back to back, launched into a stream or replayed from a CUDA graph - the price a
// training step of ~300 kernels pays in gaps (docs/benchmarks.md, "What is left at this shape").
// Each kernel spins for a fixed time on every SM (132 blocks), so the time per kernel above that
// spin is the gap. Prints one line per spin time.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "launch_gap: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

// Spins for about `cycles` SM clock cycles; one write keeps it from being optimized away.
__global__ void spin(long long cycles, float* sink) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  if (threadIdx.x == 0 && blockIdx.x == 0) sink[0] += 1.0f;
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int clock_khz = 0;
  check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "cudaDeviceGetAttribute (clock)");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  float* sink = nullptr;
  check(cudaMalloc(&sink, sizeof(float)), "cudaMalloc");
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  const int n = 500, blocks = prop.multiProcessorCount;
  std::printf("%s, %d SMs, %d kernels per measurement\n", prop.name, blocks, n);
  for (const double spin_us : {0.0, 5.0, 20.0}) {
    const long long cycles = (long long)(spin_us * clock_khz / 1e3);
    float stream_ms = 0, graph_ms = 0;
    for (int rep = 0; rep < 2; ++rep) {  // the first round warms up
      check(cudaEventRecord(a, s), "cudaEventRecord");
      for (int i = 0; i < n; ++i) spin<<<blocks, 128, 0, s>>>(cycles, sink);
      check(cudaEventRecord(b, s), "cudaEventRecord");
      check(cudaEventSynchronize(b), "cudaEventSynchronize");
      check(cudaEventElapsedTime(&stream_ms, a, b), "cudaEventElapsedTime");
      cudaGraph_t g;
      cudaGraphExec_t ge;
      check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
      for (int i = 0; i < n; ++i) spin<<<blocks, 128, 0, s>>>(cycles, sink);
      check(cudaStreamEndCapture(s, &g), "cudaStreamEndCapture");
      check(cudaGraphInstantiate(&ge, g, 0), "cudaGraphInstantiate");
      check(cudaGraphLaunch(ge, s), "cudaGraphLaunch");  // the graph's first launch uploads it
      check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      check(cudaEventRecord(a, s), "cudaEventRecord");
      check(cudaGraphLaunch(ge, s), "cudaGraphLaunch");
      check(cudaEventRecord(b, s), "cudaEventRecord");
      check(cudaEventSynchronize(b), "cudaEventSynchronize");
      check(cudaEventElapsedTime(&graph_ms, a, b), "cudaEventElapsedTime");
      check(cudaGraphExecDestroy(ge), "cudaGraphExecDestroy");
      check(cudaGraphDestroy(g), "cudaGraphDestroy");
    }
    const double per_stream = stream_ms * 1e3 / n, per_graph = graph_ms * 1e3 / n;
    std::printf("spin %4.1f us: %.3f us per kernel in a stream, %.3f us in a graph (gap %.3f / %.3f us)\n", spin_us, per_stream,
                per_graph, per_stream - spin_us, per_graph - spin_us);
  }
  check(cudaGetLastError(), "a kernel launch");
  return 0;
}
