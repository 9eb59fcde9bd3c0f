// Serves a (rewritten) SavedModel from C++, with no Python: loads the
// tf-ctr-ops op library, then the SavedModel, then runs one signature on a
// batch of strings and prints the output rows and the median latency.
//
//   serve OP_LIBRARY MODEL_DIR INPUT_TENSOR OUTPUT_TENSOR STRINGS_FILE [RUNS]
//
// INPUT_TENSOR / OUTPUT_TENSOR are the signature's tensor names
// (saved_model_cli show --dir MODEL_DIR --all lists them, e.g.
// serving_default_x:0 and StatefulPartitionedCall:0); STRINGS_FILE holds one
// input string per line (the batch, a [B] string tensor).
//
// It uses TensorFlow's C API (tensorflow/c/c_api.h), whose ABI is stable, and
// links against the libtensorflow_cc and libtensorflow_framework of the pip
// wheel (examples/serve_cc/build.sh). A model server does the same: load the
// op library before the model, so that the fused ops' kernels are registered.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tensorflow/c/c_api.h"
#include "tensorflow/c/tf_tstring.h"

namespace {

[[noreturn]] void Fail(const std::string& what, TF_Status* status) {
  std::fprintf(stderr, "serve: %s: %s\n", what.c_str(), status ? TF_Message(status) : "");
  std::exit(1);
}

void Check(TF_Status* status, const std::string& what) {
  if (TF_GetCode(status) != TF_OK) Fail(what, status);
}

// "name:port" as a TF_Output of `graph`.
TF_Output OutputOf(TF_Graph* graph, const std::string& tensor) {
  const size_t colon = tensor.rfind(':');
  const std::string name = colon == std::string::npos ? tensor : tensor.substr(0, colon);
  const int port = colon == std::string::npos ? 0 : std::atoi(tensor.c_str() + colon + 1);
  TF_Operation* op = TF_GraphOperationByName(graph, name.c_str());
  if (op == nullptr) Fail("no operation " + name + " in the model's graph", nullptr);
  return TF_Output{op, port};
}

// A [B] string tensor of the file's lines.
TF_Tensor* StringBatch(const std::string& path) {
  std::ifstream in(path);
  if (!in) Fail("cannot read " + path, nullptr);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  const int64_t dims[1] = {static_cast<int64_t>(lines.size())};
  TF_Tensor* t = TF_AllocateTensor(TF_STRING, dims, 1, sizeof(TF_TString) * lines.size());
  auto* strings = static_cast<TF_TString*>(TF_TensorData(t));
  for (size_t i = 0; i < lines.size(); ++i) {
    TF_StringInit(&strings[i]);
    TF_StringCopy(&strings[i], lines[i].data(), lines[i].size());
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: serve OP_LIBRARY MODEL_DIR INPUT_TENSOR OUTPUT_TENSOR STRINGS_FILE [RUNS]\n");
    return 2;
  }
  const int runs = argc > 6 ? std::max(1, std::atoi(argv[6])) : 20;
  TF_Status* status = TF_NewStatus();

  // The fused ops first: loading the model needs their kernels registered.
  TF_Library* library = TF_LoadLibrary(argv[1], status);
  Check(status, std::string("loading the op library ") + argv[1]);

  TF_Graph* graph = TF_NewGraph();
  TF_SessionOptions* options = TF_NewSessionOptions();
  const char* tags[] = {"serve"};
  TF_Session* session = TF_LoadSessionFromSavedModel(options, nullptr, argv[2], tags, 1, graph, nullptr, status);
  Check(status, std::string("loading the SavedModel ") + argv[2]);

  const TF_Output input = OutputOf(graph, argv[3]);
  const TF_Output output = OutputOf(graph, argv[4]);
  TF_Tensor* batch = StringBatch(argv[5]);

  TF_Tensor* result = nullptr;
  std::vector<double> times_ms;
  for (int r = 0; r < runs + 2; ++r) {  // two warm-up calls
    if (result != nullptr) TF_DeleteTensor(result);
    const auto start = std::chrono::steady_clock::now();
    TF_SessionRun(session, nullptr, &input, &batch, 1, &output, &result, 1, nullptr, 0, nullptr, status);
    const auto stop = std::chrono::steady_clock::now();
    Check(status, "running the signature");
    if (r >= 2) times_ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  if (TF_TensorType(result) != TF_FLOAT || TF_NumDims(result) != 2) Fail("the output is not a float matrix", nullptr);
  const int64_t rows = TF_Dim(result, 0), cols = TF_Dim(result, 1);
  const float* values = static_cast<const float*>(TF_TensorData(result));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) std::printf(j ? " %.9g" : "%.9g", values[i * cols + j]);
    std::printf("\n");
  }
  std::sort(times_ms.begin(), times_ms.end());
  std::fprintf(stderr, "median latency %.4f ms over %d runs\n", times_ms[times_ms.size() / 2], runs);

  TF_DeleteTensor(result);
  TF_DeleteTensor(batch);
  TF_CloseSession(session, status);
  TF_DeleteSession(session, status);
  TF_DeleteSessionOptions(options);
  TF_DeleteGraph(graph);
  TF_DeleteLibraryHandle(library);
  TF_DeleteStatus(status);
  return 0;
}
