// Serves a (rewritten) SavedModel from C++, with no Python: loads the
// tf-ctr-ops op library, then the SavedModel, then runs one signature on a
// batch of strings and prints the output rows and the median latency.
//
//   serve OP_LIBRARY MODEL_DIR SIGNATURE[:OUTPUT] INPUTS_FILE [RUNS]
//
// SIGNATURE is a signature key (serving_default, predict, ...), as a model
// server takes it: tensor names change when a model is rewritten, keys do
// not. The signature must take one string input, [B] or [B, 1] (id lists, raw
// keys, serialized tf.Examples); OUTPUT names the float output to print when
// it has several. INPUTS_FILE is the batch: one string per line, or, for a
// file named *.tfrecord or *.tfrecords, one string per record (serialized tf.Examples hold
// newlines, so an Estimator model's inputs come as TFRecords).
//
// It uses TensorFlow's C API (tensorflow/c/c_api.h), whose ABI is stable, and
// links against the libtensorflow_cc and libtensorflow_framework of the pip
// wheel (examples/serve_cc/build.sh). A model server does the same: load the
// op library before the model, so that the fused ops' kernels are registered.
// The signatures are read from the MetaGraphDef with a few lines of protobuf
// wire format rather than the generated protobuf classes, which would tie
// the example to the exact protobuf headers TensorFlow was built with.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/c/c_api.h"
#include "tensorflow/c/tf_tstring.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "serve: %s\n", what.c_str());
  std::exit(1);
}

void Check(TF_Status* status, const std::string& what) {
  if (TF_GetCode(status) != TF_OK) Fail(what + ": " + TF_Message(status));
}

// Protobuf wire format, as far as a SignatureDef needs it. It keeps its own
// copy of the message: readers are made of temporaries (a field's bytes).
class WireReader {
 public:
  explicit WireReader(std::string bytes)
      : bytes_(std::move(bytes)), p_(bytes_.data()), end_(bytes_.data() + bytes_.size()) {}
  WireReader(const WireReader&) = delete;
  WireReader& operator=(const WireReader&) = delete;

  // The next field's number and wire type; false at the end.
  bool Next(uint32_t* field, uint32_t* wire_type) {
    if (p_ >= end_) return false;
    const uint64_t tag = Varint();
    *field = static_cast<uint32_t>(tag >> 3);
    *wire_type = static_cast<uint32_t>(tag & 7);
    return true;
  }
  uint64_t Varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ >= end_) Fail("the SavedModel's MetaGraphDef is cut short");
      const uint8_t byte = static_cast<uint8_t>(*p_++);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return value;
    }
    Fail("the SavedModel's MetaGraphDef has a malformed varint");
  }
  std::string Bytes() {
    const uint64_t size = Varint();
    if (size > static_cast<uint64_t>(end_ - p_)) Fail("the SavedModel's MetaGraphDef is cut short");
    std::string out(p_, size);
    p_ += size;
    return out;
  }
  void Skip(uint32_t wire_type) {
    const int64_t fixed = wire_type == 1 ? 8 : wire_type == 5 ? 4 : -1;
    if (wire_type == 0) {
      Varint();
    } else if (wire_type == 2) {
      Bytes();
    } else if (fixed > 0 && fixed <= end_ - p_) {
      p_ += fixed;
    } else {
      Fail("the SavedModel's MetaGraphDef has a field of an unknown wire type");
    }
  }

 private:
  const std::string bytes_;
  const char* p_;
  const char* end_;
};

constexpr int kDtFloat = 1, kDtString = 7;  // tensorflow.DataType

struct TensorInfo {
  std::string name;  // "node:port" in the session's graph
  int dtype = 0;
  int rank = -1;  // -1: unknown
  std::vector<int64_t> dims;
};

using TensorMap = std::map<std::string, TensorInfo>;

struct Signature {
  TensorMap inputs, outputs;
};

TensorInfo ParseTensorInfo(const std::string& bytes) {
  TensorInfo info;
  WireReader in(bytes);
  for (uint32_t field, wire; in.Next(&field, &wire);) {
    if (field == 1 && wire == 2) {
      info.name = in.Bytes();
    } else if (field == 2 && wire == 0) {
      info.dtype = static_cast<int>(in.Varint());
    } else if (field == 3 && wire == 2) {  // TensorShapeProto
      WireReader shape(in.Bytes());
      info.rank = 0;
      for (uint32_t f, w; shape.Next(&f, &w);) {
        if (f == 2 && w == 2) {  // Dim
          WireReader dim(shape.Bytes());
          int64_t size = -1;
          for (uint32_t df, dw; dim.Next(&df, &dw);) {
            if (df == 1 && dw == 0) size = static_cast<int64_t>(dim.Varint());
            else dim.Skip(dw);
          }
          info.dims.push_back(size);
          ++info.rank;
        } else if (f == 3 && w == 0) {
          if (shape.Varint()) info.rank = -1;  // unknown_rank
        } else {
          shape.Skip(w);
        }
      }
    } else {
      in.Skip(wire);
    }
  }
  return info;
}

// A map<string, M> field's entry: key 1, value 2.
std::pair<std::string, std::string> ParseMapEntry(const std::string& bytes) {
  std::pair<std::string, std::string> entry;
  WireReader in(bytes);
  for (uint32_t field, wire; in.Next(&field, &wire);) {
    if (field == 1 && wire == 2) entry.first = in.Bytes();
    else if (field == 2 && wire == 2) entry.second = in.Bytes();
    else in.Skip(wire);
  }
  return entry;
}

Signature ParseSignature(const std::string& bytes) {
  Signature signature;
  WireReader in(bytes);
  for (uint32_t field, wire; in.Next(&field, &wire);) {
    if ((field == 1 || field == 2) && wire == 2) {
      auto [key, info] = ParseMapEntry(in.Bytes());
      (field == 1 ? signature.inputs : signature.outputs)[key] = ParseTensorInfo(info);
    } else {
      in.Skip(wire);
    }
  }
  return signature;
}

std::map<std::string, Signature> SignaturesOf(const TF_Buffer* meta_graph) {
  std::map<std::string, Signature> signatures;
  WireReader in(std::string(static_cast<const char*>(meta_graph->data), meta_graph->length));
  for (uint32_t field, wire; in.Next(&field, &wire);) {
    if (field == 5 && wire == 2) {  // MetaGraphDef.signature_def
      auto [key, signature] = ParseMapEntry(in.Bytes());
      if (key.rfind("__", 0) != 0) signatures[key] = ParseSignature(signature);  // not TF's __saved_model_init_op
    } else {
      in.Skip(wire);
    }
  }
  return signatures;
}

template <typename Map>
std::string KeysOf(const Map& map) {
  std::string keys;
  for (const auto& [key, value] : map) keys += (keys.empty() ? "" : ", ") + key;
  return keys.empty() ? "none" : keys;
}

// "name:port" as a TF_Output of `graph`.
TF_Output OutputOf(TF_Graph* graph, const std::string& tensor) {
  const size_t colon = tensor.rfind(':');
  const std::string name = tensor.substr(0, colon);
  const std::string port = colon == std::string::npos ? "0" : tensor.substr(colon + 1);
  TF_Operation* op = TF_GraphOperationByName(graph, name.c_str());
  if (op == nullptr || port.empty() || port.find_first_not_of("0123456789") != std::string::npos)
    Fail("the signature names " + tensor + ", which is not in the model's graph");
  return TF_Output{op, std::atoi(port.c_str())};
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The batch: one string per line (a trailing '\r' dropped, so that a file
// written on Windows reads the same), or per TFRecord record.
std::vector<std::string> ReadInputs(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Fail("cannot read " + path);
  std::vector<std::string> strings;
  if (EndsWith(path, ".tfrecord") || EndsWith(path, ".tfrecords")) {
    // Record: length (uint64, little-endian), its CRC, the bytes, their CRC.
    // The CRCs are not checked: a cut-short file is still an error.
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (size_t at = 0; at < bytes.size();) {
      uint64_t length = 0;
      if (bytes.size() - at < 12) Fail(path + " is not a TFRecord file (a record's header is cut short)");
      for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(bytes[at + i]);
      at += 12;
      if (length > bytes.size() - at || bytes.size() - at - length < 4)
        Fail(path + " is not a TFRecord file (record " + std::to_string(strings.size()) + " is cut short)");
      strings.push_back(bytes.substr(at, length));
      at += length + 4;
    }
    return strings;
  }
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    strings.push_back(line);
  }
  return strings;
}

// The signature's one input, checked: strings, [B] or [B, 1].
const TensorInfo& StringInputOf(const Signature& signature, const std::string& key) {
  if (signature.inputs.size() != 1)
    Fail("signature " + key + " takes the inputs " + KeysOf(signature.inputs) + "; this example feeds one");
  const TensorInfo& input = signature.inputs.begin()->second;
  const bool batch_shape = input.rank == -1 || input.rank == 1 || (input.rank == 2 && input.dims[1] == 1);
  if (input.dtype != kDtString || !batch_shape)
    Fail("signature " + key + "'s input " + signature.inputs.begin()->first + " is not a [B] or [B, 1] string tensor");
  return input;
}

const TensorInfo& FloatOutputOf(const Signature& signature, const std::string& key, const std::string& output_key) {
  if (output_key.empty() && signature.outputs.size() != 1)
    Fail("signature " + key + " has the outputs " + KeysOf(signature.outputs) + ": name one, as " + key + ":OUTPUT");
  const auto found = output_key.empty() ? signature.outputs.begin() : signature.outputs.find(output_key);
  if (found == signature.outputs.end())
    Fail("signature " + key + " has no output " + output_key + "; its outputs: " + KeysOf(signature.outputs));
  if (found->second.dtype != kDtFloat) Fail("output " + found->first + " of signature " + key + " is not float32");
  return found->second;
}

TF_Tensor* StringBatch(const std::vector<std::string>& strings, int rank) {
  const int64_t dims[2] = {static_cast<int64_t>(strings.size()), 1};
  TF_Tensor* t = TF_AllocateTensor(TF_STRING, dims, rank == 2 ? 2 : 1, sizeof(TF_TString) * strings.size());
  auto* values = static_cast<TF_TString*>(TF_TensorData(t));
  for (size_t i = 0; i < strings.size(); ++i) {
    TF_StringInit(&values[i]);
    TF_StringCopy(&values[i], strings[i].data(), strings[i].size());
  }
  return t;
}

// TF_DeleteTensor frees the tensor's buffer, not the heap copies of the
// strings longer than a TF_TString holds inline.
void DeleteStringBatch(TF_Tensor* t) {
  auto* values = static_cast<TF_TString*>(TF_TensorData(t));
  for (int64_t i = 0, n = TF_TensorElementCount(t); i < n; ++i) TF_StringDealloc(&values[i]);
  TF_DeleteTensor(t);
}

void PrintRows(const TF_Tensor* result) {
  if (TF_TensorType(result) != TF_FLOAT || TF_NumDims(result) < 1 || TF_NumDims(result) > 2)
    Fail("the output is a " + std::to_string(TF_NumDims(result)) + "-d tensor of TF_DataType " +
         std::to_string(TF_TensorType(result)) + "; this example prints float [B] or [B, D] outputs");
  const int64_t rows = TF_Dim(result, 0), cols = TF_NumDims(result) == 2 ? TF_Dim(result, 1) : 1;
  const float* values = static_cast<const float*>(TF_TensorData(result));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) std::printf(j ? " %.9g" : "%.9g", values[i * cols + j]);
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || argc > 6) {
    std::fprintf(stderr, "usage: serve OP_LIBRARY MODEL_DIR SIGNATURE[:OUTPUT] INPUTS_FILE [RUNS]\n");
    return 2;
  }
  const int runs = argc > 5 ? std::max(1, std::atoi(argv[5])) : 20;
  const std::string requested = argv[3];
  const size_t colon = requested.find(':');
  const std::string key = requested.substr(0, colon);
  const std::string output_key = colon == std::string::npos ? "" : requested.substr(colon + 1);
  TF_Status* status = TF_NewStatus();

  // The fused ops first: loading the model needs their kernels registered.
  TF_Library* library = TF_LoadLibrary(argv[1], status);
  Check(status, std::string("loading the op library ") + argv[1]);

  TF_Graph* graph = TF_NewGraph();
  TF_SessionOptions* options = TF_NewSessionOptions();
  TF_Buffer* meta_graph = TF_NewBuffer();
  const char* tags[] = {"serve"};
  TF_Session* session = TF_LoadSessionFromSavedModel(options, nullptr, argv[2], tags, 1, graph, meta_graph, status);
  Check(status, std::string("loading the SavedModel ") + argv[2]);

  const std::map<std::string, Signature> signatures = SignaturesOf(meta_graph);
  const auto signature = signatures.find(key);
  if (signature == signatures.end())
    Fail("the SavedModel has no signature " + key + "; its signatures: " + KeysOf(signatures));
  const TensorInfo& input_info = StringInputOf(signature->second, key);
  const TF_Output input = OutputOf(graph, input_info.name);
  const TF_Output output = OutputOf(graph, FloatOutputOf(signature->second, key, output_key).name);
  const std::vector<std::string> strings = ReadInputs(argv[4]);
  // The C API runs whatever batch it is fed; a model server, like Python,
  // refuses a batch the signature's fixed size does not admit.
  if (input_info.rank >= 1 && input_info.dims[0] >= 0 && input_info.dims[0] != static_cast<int64_t>(strings.size()))
    Fail("signature " + key + " takes a batch of " + std::to_string(input_info.dims[0]) + " strings; " + argv[4] +
         " holds " + std::to_string(strings.size()));
  TF_Tensor* batch = StringBatch(strings, input_info.rank);

  TF_Tensor* result = nullptr;
  std::vector<double> times_ms;
  for (int r = 0; r < runs + 2; ++r) {  // two warm-up calls
    if (result != nullptr) TF_DeleteTensor(result);
    result = nullptr;
    const auto start = std::chrono::steady_clock::now();
    TF_SessionRun(session, nullptr, &input, &batch, 1, &output, &result, 1, nullptr, 0, nullptr, status);
    const auto stop = std::chrono::steady_clock::now();
    Check(status, "running signature " + key);
    if (r >= 2) times_ms.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  PrintRows(result);
  std::sort(times_ms.begin(), times_ms.end());
  std::fprintf(stderr, "median latency %.4f ms over %d runs\n", times_ms[times_ms.size() / 2], runs);

  TF_DeleteTensor(result);
  DeleteStringBatch(batch);
  TF_DeleteBuffer(meta_graph);
  TF_CloseSession(session, status);
  TF_DeleteSession(session, status);
  TF_DeleteSessionOptions(options);
  TF_DeleteGraph(graph);
  TF_DeleteLibraryHandle(library);
  TF_DeleteStatus(status);
  return 0;
}
