#include "model/gguf.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "gguf_writer.h"
#include "model/model.h"
#include "test_support.h"

namespace cf {
namespace {

using test::GgufWriter;
using ::testing::AllOf;
using ::testing::HasSubstr;
using Bytes = GgufWriter::Bytes;

std::unique_ptr<GgufFile> parse(const Bytes& b) { return GgufFile::from_bytes(b.data(), b.size(), "test.gguf"); }

// The message of the GgufError that parsing `b` throws ("" when it parses).
std::string parse_error(const Bytes& b) {
  try {
    parse(b);
  } catch (const GgufError& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------------------------------
// The real default model, checked against facts read with the python `gguf` package.

class RealModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (test::have_default_model()) file_ = GgufFile::open(test::default_model_path()).release();
  }
  static void TearDownTestSuite() {
    delete file_;
    file_ = nullptr;
  }
  static GgufFile* file_;
};
GgufFile* RealModel::file_ = nullptr;

TEST_F(RealModel, HeaderAndHyperparameters) {
  CF_REQUIRE_MODEL();
  const GgufFile& f = *file_;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.file_size(), std::filesystem::file_size(test::default_model_path()));
  EXPECT_EQ(f.data_offset(), 1785664u);
  EXPECT_EQ(f.metadata().size(), 33u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 30);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.feed_forward_length"), 1536);
  EXPECT_EQ(f.get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(f.get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_NEAR(*f.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-12);
  EXPECT_EQ(f.get_bool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(f.get_int("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_FALSE(f.get_int("no.such.key").has_value());
  EXPECT_THAT(std::string(*f.get_string("tokenizer.chat_template")), HasSubstr("<|im_start|>"));
}

TEST_F(RealModel, TokenizerArrays) {
  CF_REQUIRE_MODEL();
  const auto tokens = file_->get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 49152u);
  EXPECT_EQ(tokens[0], "<|endoftext|>");
  EXPECT_EQ(tokens[1], "<|im_start|>");
  EXPECT_EQ(tokens[2], "<|im_end|>");
  EXPECT_EQ(file_->get_string_array("tokenizer.ggml.merges").size(), 48900u);
  const auto types = file_->get_int_array("tokenizer.ggml.token_type");
  ASSERT_EQ(types.size(), 49152u);
  EXPECT_EQ(types[0], 3);  // control token
  EXPECT_THROW(file_->get_int_array("tokenizer.ggml.tokens"), GgufError);
}

TEST_F(RealModel, Tensors) {
  CF_REQUIRE_MODEL();
  const GgufFile& f = *file_;
  ASSERT_EQ(f.tensors().size(), 272u);
  const GgufTensor& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.type, GgmlType::Q8_0);
  EXPECT_EQ(emb.dims, (std::vector<uint64_t>{576, 49152}));
  EXPECT_EQ(emb.rows(), 49152u);
  EXPECT_EQ(emb.n_elements, 576u * 49152u);
  EXPECT_EQ(emb.n_bytes, 30081024u);
  EXPECT_EQ(emb.file_offset, 1785664u);
  const GgufTensor& down = f.tensor("blk.0.ffn_down.weight");
  EXPECT_EQ(down.type, GgmlType::Q4_1);
  EXPECT_EQ(down.dims, (std::vector<uint64_t>{1536, 576}));
  EXPECT_EQ(down.file_offset, 31868992u);
  EXPECT_EQ(down.n_bytes, 552960u);
  EXPECT_EQ(f.tensor("blk.29.attn_norm.weight").type, GgmlType::F32);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // tied to token_embd
  EXPECT_THROW(f.tensor("output.weight"), GgufError);

  std::map<GgmlType, int> counts;
  for (const auto& t : f.tensors()) {
    ++counts[t.type];
    const uint8_t* begin = t.data;
    const uint8_t* file_begin = f.tensor("token_embd.weight").data - emb.file_offset;
    EXPECT_EQ(begin - file_begin, static_cast<ptrdiff_t>(t.file_offset)) << t.name;
    EXPECT_LE(t.file_offset + t.n_bytes, f.file_size()) << t.name;
    EXPECT_GE(t.file_offset, f.data_offset()) << t.name;
    EXPECT_EQ(t.file_offset % 32, 0u) << t.name;
  }
  EXPECT_EQ(counts[GgmlType::Q4_1], 210);
  EXPECT_EQ(counts[GgmlType::F32], 61);
  EXPECT_EQ(counts[GgmlType::Q8_0], 1);
  // The norm weights are plain floats near 1; reading one proves the mapping is live.
  const GgufTensor& norm = f.tensor("blk.0.attn_norm.weight");
  float first;
  std::memcpy(&first, norm.data, sizeof(first));
  EXPECT_GT(first, -100.0f);
  EXPECT_LT(first, 100.0f);
}

TEST(GgufOpen, MissingFileNamesThePath) {
  try {
    GgufFile::open("/nonexistent/dir/model.gguf");
    FAIL() << "expected GgufError";
  } catch (const GgufError& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/dir/model.gguf"));
    EXPECT_THAT(e.what(), HasSubstr("cannot open"));
  }
}

// ---------------------------------------------------------------------------------------
// Synthetic files.

// A small file with every value type and a few tensors of different types.
GgufWriter full_writer(uint32_t version) {
  GgufWriter w(version);
  w.add_string("general.architecture", "llama")
      .add_u8("t.u8", 200)
      .add_i8("t.i8", -100)
      .add_u16("t.u16", 60000)
      .add_i16("t.i16", -30000)
      .add_u32("t.u32", 4000000000u)
      .add_i32("t.i32", -2000000000)
      .add_u64("t.u64", 1ull << 40)
      .add_i64("t.i64", -(1ll << 40))
      .add_f32("t.f32", 1.5f)
      .add_f64("t.f64", -2.25)
      .add_bool("t.bool", true)
      .add_string("t.str", "line1\nline2")
      .add_string("t.empty", "")
      .add_array<int32_t>("t.arr_i32", GgufValueType::INT32, {1, -2, 3})
      .add_array<float>("t.arr_f32", GgufValueType::FLOAT32, {0.5f, 0.25f})
      .add_array<uint8_t>("t.arr_bool", GgufValueType::BOOL, {1, 0})
      .add_string_array("t.arr_str", {"a", "bc", ""});
  // An array of two arrays of uint16: [[7, 8], []].
  Bytes inner1 = GgufWriter::array_payload(GgufValueType::UINT16, 2, {7, 0, 8, 0});
  Bytes inner2 = GgufWriter::array_payload(GgufValueType::UINT16, 0, {});
  Bytes elems = inner1;
  elems.insert(elems.end(), inner2.begin(), inner2.end());
  w.add_raw("t.nested", static_cast<uint32_t>(GgufValueType::ARRAY),
            GgufWriter::array_payload(GgufValueType::ARRAY, 2, elems));
  w.add_tensor("a.weight", GgmlType::F32, {4, 3})
      .add_tensor("b.weight", GgmlType::Q4_1, {64, 2})
      .add_tensor("c.weight", GgmlType::Q8_0, {32})
      .add_tensor("d.weight", GgmlType::F16, {2, 2, 2, 2});
  return w;
}

class GgufVersions : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufVersions, AllValueTypesRoundTrip) {
  GgufWriter w = full_writer(GetParam());
  const Bytes b = w.build();
  auto f = parse(b);
  EXPECT_EQ(f->version(), GetParam());
  EXPECT_EQ(f->file_size(), b.size());
  EXPECT_EQ(f->data_offset(), w.data_offset());
  EXPECT_EQ(f->metadata().size(), 19u);
  EXPECT_EQ(f->get_int("t.u8"), 200);
  EXPECT_EQ(f->get_int("t.i8"), -100);
  EXPECT_EQ(f->get_int("t.u16"), 60000);
  EXPECT_EQ(f->get_int("t.i16"), -30000);
  EXPECT_EQ(f->get_int("t.u32"), 4000000000ll);
  EXPECT_EQ(f->get_int("t.i32"), -2000000000);
  EXPECT_EQ(f->get_int("t.u64"), 1ll << 40);
  EXPECT_EQ(f->get_int("t.i64"), -(1ll << 40));
  EXPECT_EQ(f->get_float("t.f32"), 1.5);
  EXPECT_EQ(f->get_float("t.f64"), -2.25);
  EXPECT_EQ(f->get_float("t.i32"), -2e9);  // integers convert to float
  EXPECT_EQ(f->get_bool("t.bool"), true);
  EXPECT_EQ(f->get_string("t.str"), "line1\nline2");
  EXPECT_EQ(f->get_string("t.empty"), "");
  EXPECT_EQ(f->get_int_array("t.arr_i32"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f->get_float_array("t.arr_f32"), (std::vector<double>{0.5, 0.25}));
  EXPECT_EQ(f->get_float_array("t.arr_i32"), (std::vector<double>{1, -2, 3}));
  EXPECT_EQ(f->get_string_array("t.arr_str"), (std::vector<std::string_view>{"a", "bc", ""}));
  EXPECT_EQ(std::get<uint8_t>(f->find("t.u8")->scalar), 200);
  EXPECT_EQ(f->find("t.u8")->type, GgufValueType::UINT8);

  const GgufValue* nested = f->find("t.nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->type, GgufValueType::ARRAY);
  ASSERT_EQ(nested->array->elem_type, GgufValueType::ARRAY);
  ASSERT_EQ(nested->array->size(), 2u);
  EXPECT_EQ(nested->array->nested[0].elem_type, GgufValueType::UINT16);
  ASSERT_EQ(nested->array->nested[0].items.size(), 2u);
  EXPECT_EQ(std::get<uint16_t>(nested->array->nested[0].items[1]), 8);
  EXPECT_EQ(nested->array->nested[1].size(), 0u);
  EXPECT_EQ(GgufFile::to_string(*nested), "[[7, 8], []]");

  ASSERT_EQ(f->tensors().size(), 4u);
  const auto& a = f->tensor("a.weight");
  EXPECT_EQ(a.type, GgmlType::F32);
  EXPECT_EQ(a.n_elements, 12u);
  EXPECT_EQ(a.n_bytes, 48u);
  EXPECT_EQ(a.rows(), 3u);
  const auto& bq = f->tensor("b.weight");
  EXPECT_EQ(bq.n_bytes, 2u * 2u * 20u);  // two rows of two Q4_1 blocks
  EXPECT_EQ(f->tensor("c.weight").n_bytes, 34u);
  EXPECT_EQ(f->tensor("d.weight").n_elements, 16u);
  for (const auto& t : f->tensors()) {
    EXPECT_EQ(t.file_offset % 32, 0u);
    // Data is the writer's pattern, read back through the pointer.
    for (uint64_t i = 0; i < t.n_bytes; ++i) ASSERT_EQ(t.data[i], b[t.file_offset + i]) << t.name;
  }
}

TEST_P(GgufVersions, OpenFromDiskMatchesFromBytes) {
  const Bytes b = full_writer(GetParam()).build();
  const std::string path = ::testing::TempDir() + "gguf_test_" + std::to_string(::getpid()) + ".gguf";
  GgufWriter::write_file(path, b);
  {
    auto f = GgufFile::open(path);
    EXPECT_EQ(f->path(), path);
    EXPECT_EQ(f->file_size(), b.size());
    EXPECT_EQ(f->tensors().size(), 4u);
    const auto& t = f->tensor("b.weight");
    EXPECT_EQ(0, std::memcmp(t.data, b.data() + t.file_offset, t.n_bytes));
    EXPECT_EQ(f->get_string("t.str"), "line1\nline2");
  }
  std::filesystem::remove(path);
}

TEST_P(GgufVersions, EveryTruncationThrows) {
  const Bytes b = full_writer(GetParam()).build();
  ASSERT_NO_THROW(parse(b));
  for (size_t n = 0; n < b.size(); ++n) {
    const Bytes cut(b.begin(), b.begin() + static_cast<ptrdiff_t>(n));
    EXPECT_THROW(parse(cut), GgufError) << "prefix of " << n << " bytes";
  }
}

INSTANTIATE_TEST_SUITE_P(V2V3, GgufVersions, ::testing::Values(2u, 3u));

TEST(GgufSynthetic, TruncatedTensorDataMessage) {
  Bytes b = full_writer(3).build();
  b.pop_back();
  // d.weight is last: its data end is the full file size.
  EXPECT_THAT(parse_error(b), HasSubstr("test.gguf: truncated: tensor 'd.weight' data ends at byte " +
                                        std::to_string(b.size() + 1) + " but the file has " +
                                        std::to_string(b.size()) + " bytes at offset"));
}

TEST(GgufSynthetic, EmptyFileAndNoTensors) {
  EXPECT_THAT(parse_error({}), HasSubstr("truncated"));
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  auto f = parse(w.build());
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->metadata().size(), 1u);
}

TEST(GgufSynthetic, CustomAlignment) {
  GgufWriter w;
  w.set_alignment(64).add_tensor("x", GgmlType::F32, {3}).add_tensor("y", GgmlType::F32, {5});
  auto f = parse(w.build());
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(f->tensor("y").file_offset - f->tensor("x").file_offset, 64u);
}

TEST(GgufSynthetic, ToStringAbbreviatesAndEscapes) {
  GgufWriter w;
  std::vector<int32_t> many(20);
  for (int i = 0; i < 20; ++i) many[i] = i;
  w.add_array<int32_t>("many", GgufValueType::INT32, many)
      .add_string("s", "a\"b\n\x01")
      .add_f32("f", 0.1f)
      .add_bool("b", false)
      .add_i8("i8", -5);
  auto f = parse(w.build());
  EXPECT_EQ(GgufFile::to_string(*f->find("many"), 3), "[0, 1, 2, ... (20 items)]");
  EXPECT_THAT(GgufFile::to_string(*f->find("many"), 100), HasSubstr(", 19]"));
  EXPECT_EQ(GgufFile::to_string(*f->find("s")), "\"a\\\"b\\n\\x01\"");
  EXPECT_EQ(GgufFile::to_string(*f->find("f")), "0.1");
  EXPECT_EQ(GgufFile::to_string(*f->find("b")), "false");
  EXPECT_EQ(GgufFile::to_string(*f->find("i8")), "-5");
}

// ---------------------------------------------------------------------------------------
// Damaged files: each must throw GgufError whose message says what is wrong.

TEST(GgufDamage, BadMagic) {
  GgufWriter w;
  w.magic = "GGML";
  EXPECT_THAT(parse_error(w.build()), HasSubstr("bad magic"));
}

TEST(GgufDamage, Version1IsRejectedClearly) {
  EXPECT_THAT(parse_error(GgufWriter(1).build()), HasSubstr("version 1 is not supported"));
}

TEST(GgufDamage, UnknownVersion) {
  EXPECT_THAT(parse_error(GgufWriter(99).build()), HasSubstr("unsupported GGUF version 99"));
}

TEST(GgufDamage, BigEndianIsRejectedClearly) {
  Bytes b = GgufWriter(3).build();
  std::swap(b[4], b[7]);  // the version as a big-endian writer stores it
  std::swap(b[5], b[6]);
  EXPECT_THAT(parse_error(b), HasSubstr("big-endian GGUF files are not supported at offset 4"));
}

TEST(GgufDamage, HugeTensorCount) {
  GgufWriter w = full_writer(3);
  w.tensor_count_override = 1ull << 60;
  EXPECT_THAT(parse_error(w.build()), HasSubstr("tensor count 1152921504606846976 cannot fit"));
}

TEST(GgufDamage, HugeKvCount) {
  GgufWriter w = full_writer(3);
  w.kv_count_override = std::numeric_limits<uint64_t>::max();
  EXPECT_THAT(parse_error(w.build()), HasSubstr("metadata count 18446744073709551615 cannot fit"));
}

TEST(GgufDamage, HugeStringLength) {
  GgufWriter w;
  Bytes p;
  GgufWriter::put<uint64_t>(p, 1ull << 62);
  p.insert(p.end(), {'a', 'b', 'c'});
  w.add_raw("s", static_cast<uint32_t>(GgufValueType::STRING), p);
  EXPECT_THAT(parse_error(w.build()), HasSubstr("string value claims 4611686018427387904 bytes"));
}

TEST(GgufDamage, HugeKeyLength) {
  Bytes b{'G', 'G', 'U', 'F'};
  GgufWriter::put<uint32_t>(b, 3);
  GgufWriter::put<uint64_t>(b, 0);
  GgufWriter::put<uint64_t>(b, 1);
  GgufWriter::put<uint64_t>(b, ~0ull);
  b.resize(b.size() + 16, 'k');
  EXPECT_THAT(parse_error(b), HasSubstr("metadata key claims"));
  EXPECT_THAT(parse_error(b), HasSubstr("at offset 24"));
}

TEST(GgufDamage, HugeArrayLength) {
  for (auto elem : {GgufValueType::UINT8, GgufValueType::STRING, GgufValueType::ARRAY, GgufValueType::FLOAT64}) {
    GgufWriter w;
    w.add_raw("arr", static_cast<uint32_t>(GgufValueType::ARRAY), GgufWriter::array_payload(elem, 1ull << 61, {1, 2, 3}));
    EXPECT_THAT(parse_error(w.build()), HasSubstr("array element")) << static_cast<int>(elem);
  }
}

TEST(GgufDamage, ArrayNestingTooDeep) {
  // Depth d: d-1 wrapping arrays of one element around an empty uint8 array.
  auto nested = [](int depth) {
    Bytes p = GgufWriter::array_payload(GgufValueType::UINT8, 0, {});
    for (int i = 1; i < depth; ++i) p = GgufWriter::array_payload(GgufValueType::ARRAY, 1, p);
    GgufWriter w;
    w.add_raw("deep", static_cast<uint32_t>(GgufValueType::ARRAY), p);
    return w.build();
  };
  EXPECT_NO_THROW(parse(nested(8)));
  EXPECT_THAT(parse_error(nested(9)), HasSubstr("nested deeper than 8"));
  EXPECT_THAT(parse_error(nested(1000)), HasSubstr("nested deeper than 8"));
}

TEST(GgufDamage, UnknownValueTypeAndBadBool) {
  GgufWriter w;
  w.add_raw("weird", 13, {0, 0, 0, 0});
  EXPECT_THAT(parse_error(w.build()), HasSubstr("unknown value type 13 for metadata key 'weird'"));
  GgufWriter w2;
  w2.add_raw("flag", static_cast<uint32_t>(GgufValueType::BOOL), {2});
  EXPECT_THAT(parse_error(w2.build()), HasSubstr("bool value 2"));
}

TEST(GgufDamage, TooManyDims) {
  GgufWriter w;
  w.add_tensor_raw({"t5", static_cast<uint32_t>(GgmlType::F32), {1, 1, 1, 1, 1}, Bytes(4), 0});
  EXPECT_THAT(parse_error(w.build()), HasSubstr("tensor 't5' has 5 dimensions"));
}

TEST(GgufDamage, ZeroDim) {
  GgufWriter w;
  w.add_tensor_raw({"z", static_cast<uint32_t>(GgmlType::F32), {4, 0}, Bytes(16), 0});
  EXPECT_THAT(parse_error(w.build()), HasSubstr("tensor 'z' has dimension 1 equal to zero"));
}

TEST(GgufDamage, DimProductOverflow) {
  GgufWriter w;
  w.add_tensor_raw({"big", static_cast<uint32_t>(GgmlType::F32), {1ull << 32, 1ull << 32}, Bytes(4), 0});
  EXPECT_THAT(parse_error(w.build()), HasSubstr("tensor 'big' element count overflows"));
  // Fits in elements but not in bytes.
  GgufWriter w2;
  w2.add_tensor_raw({"big2", static_cast<uint32_t>(GgmlType::F64), {1ull << 31, 1ull << 31}, Bytes(8), 0});
  EXPECT_THAT(parse_error(w2.build()), HasSubstr("tensor 'big2' byte size overflows"));
}

TEST(GgufDamage, UnknownTensorType) {
  GgufWriter w;
  w.add_tensor_raw({"u", 99, {4}, Bytes(16), 0});
  EXPECT_THAT(parse_error(w.build()), HasSubstr("tensor 'u' has unknown type id 99"));
}

TEST(GgufDamage, KnownButUnsupportedTypeIsListed) {
  GgufWriter w;
  w.add_tensor("k", GgmlType::Q2_K, {256});
  auto f = parse(w.build());
  EXPECT_EQ(f->tensor("k").type, GgmlType::Q2_K);
  EXPECT_EQ(f->tensor("k").n_bytes, 84u);
}

TEST(GgufDamage, RowNotWholeBlocks) {
  GgufWriter w;
  w.add_tensor_raw({"q", static_cast<uint32_t>(GgmlType::Q4_0), {33}, Bytes(64), 0});
  EXPECT_THAT(parse_error(w.build()), HasSubstr("row length 33 is not a multiple of the Q4_0 block size 32"));
}

TEST(GgufDamage, MisalignedOffset) {
  GgufWriter w;
  w.add_tensor("a", GgmlType::F32, {4}).add_tensor("b", GgmlType::F32, {4}, 48);
  EXPECT_THAT(parse_error(w.build()), HasSubstr("tensor 'b' data offset 48 is not a multiple of the alignment 32"));
}

TEST(GgufDamage, TensorPastEndOfFile) {
  GgufWriter w;
  w.add_tensor("a", GgmlType::F32, {4});
  Bytes b = w.build();
  b.pop_back();
  EXPECT_THAT(parse_error(b), HasSubstr("truncated: tensor 'a' data ends at byte"));
  GgufWriter w2;
  w2.add_tensor_raw({"far", static_cast<uint32_t>(GgmlType::F32), {4}, {}, 1ull << 40});
  EXPECT_THAT(parse_error(w2.build()), HasSubstr("tensor 'far' data ends at byte"));
  GgufWriter w3;
  w3.add_tensor_raw({"wrap", static_cast<uint32_t>(GgmlType::F32), {4}, {}, ~0ull - 31});
  EXPECT_THAT(parse_error(w3.build()), HasSubstr("tensor 'wrap' data range overflows"));
}

TEST(GgufDamage, OverlappingTensors) {
  GgufWriter w;
  w.add_tensor("a", GgmlType::F32, {16}, 0).add_tensor("b", GgmlType::F32, {4}, 32);
  EXPECT_THAT(parse_error(w.build()), HasSubstr("tensor 'b' data overlaps tensor 'a'"));
  // Adjacent (touching) ranges are fine.
  GgufWriter ok;
  ok.add_tensor("a", GgmlType::F32, {16}, 0).add_tensor("b", GgmlType::F32, {4}, 64);
  EXPECT_NO_THROW(parse(ok.build()));
}

// Issue 17: a Q4_1 tensor relabelled Q4_0 (type byte changed) still fits its span, loaded,
// and the model answered garbage. The size from type and shape must fill the span up to the
// next tensor (or the end of the file), padding aside. (A size that differs by less than the
// alignment, 32 bytes, cannot be told from padding; real weight tensors differ by far more.)
TEST(GgufDamage, TypeThatDoesNotFillItsSpanIsNamed) {
  auto relabelled = [](GgmlType written, GgmlType claimed, bool last) {
    GgufWriter w;
    const uint64_t n = ggml_row_bytes(written, 64) * 16;  // 640 bytes as Q4_1, 576 as Q4_0
    w.add_tensor_raw({"blk.0.attn_q.weight", static_cast<uint32_t>(claimed), {64, 16}, Bytes(n, 7), std::nullopt});
    if (!last) w.add_tensor("output_norm.weight", GgmlType::F32, {8});
    return w.build();
  };
  EXPECT_THAT(parse_error(relabelled(GgmlType::Q4_1, GgmlType::Q4_0, false)),
              AllOf(HasSubstr("tensor 'blk.0.attn_q.weight' is 576 bytes by its type Q4_0"),
                    HasSubstr("spans 640 bytes up to tensor 'output_norm.weight'"), HasSubstr("wrong type or shape")));
  EXPECT_THAT(parse_error(relabelled(GgmlType::Q4_1, GgmlType::Q4_0, true)),
              HasSubstr("spans 640 bytes up to the end of the file"));
  // The right type, with the writer's alignment padding after it, is fine.
  GgufWriter ok;
  ok.add_tensor("a", GgmlType::F32, {3}).add_tensor("b", GgmlType::F32, {3});
  EXPECT_NO_THROW(parse(ok.build()));
}

TEST(GgufDamage, DuplicateNames) {
  GgufWriter w;
  w.add_tensor("same", GgmlType::F32, {4}).add_tensor("same", GgmlType::F32, {4});
  EXPECT_THAT(parse_error(w.build()), HasSubstr("duplicate tensor 'same'"));
  GgufWriter k;
  k.add_u32("key", 1).add_string("key", "again");
  EXPECT_THAT(parse_error(k.build()), HasSubstr("duplicate metadata key 'key'"));
}

TEST(GgufDamage, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    GgufWriter w;
    w.add_u32("general.alignment", a);
    EXPECT_THAT(parse_error(w.build()), HasSubstr("general.alignment " + std::to_string(a) +
                                                  " is not a positive power of two at offset 24"));
  }
  GgufWriter w;
  w.add_string("general.alignment", "32");
  EXPECT_THAT(parse_error(w.build()), HasSubstr("general.alignment is a string"));
}

TEST(GgufDamage, WrongTypeGetters) {
  auto f = parse(full_writer(3).build());
  try {
    f->get_int("t.str");
    FAIL() << "expected GgufError";
  } catch (const GgufError& e) {
    EXPECT_THAT(e.what(), HasSubstr("metadata key 't.str' is string, expected an integer"));
  }
  EXPECT_THROW(f->get_string("t.u32"), GgufError);
  EXPECT_THROW(f->get_bool("t.u8"), GgufError);
  EXPECT_THROW(f->get_float("t.str"), GgufError);
  EXPECT_THROW(f->get_int("t.f32"), GgufError);
  EXPECT_THROW(f->get_int("t.bool"), GgufError);
  EXPECT_THROW(f->get_string("t.arr_str"), GgufError);
  EXPECT_THROW(f->get_string_array("t.arr_i32"), GgufError);
  EXPECT_THROW(f->get_string_array("missing"), GgufError);
  EXPECT_THROW(f->get_int_array("t.arr_f32"), GgufError);
  EXPECT_THROW(f->get_float_array("t.arr_str"), GgufError);
  EXPECT_THROW(f->get_int_array("t.u32"), GgufError);
  // A uint64 above INT64_MAX is an integer, but not one get_int can return.
  GgufWriter w;
  w.add_u64("big", ~0ull);
  EXPECT_THAT(parse_error(w.build()), ::testing::IsEmpty());
  EXPECT_THROW(parse(w.build())->get_int("big"), GgufError);
}

// The layers are loaded in parallel: an error met on a worker thread (here a layer near the
// end whose matrix is stored transposed: same bytes, so the file parses) still reaches the
// caller as the model error naming the tensor, and the load neither hangs nor aborts.
TEST(ModelLoad, BadLayerTensorIsNamedFromAnyThread) {
  CF_REQUIRE_MODEL();
  std::ifstream in(test::default_model_path(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string name = "blk.27.ffn_down.weight";
  const size_t at = bytes.find(name);  // tensor info: name, n_dims (u32), dims (u64 each)
  ASSERT_NE(at, std::string::npos);
  char* dims = bytes.data() + at + name.size() + 4;
  uint64_t d0, d1;
  std::memcpy(&d0, dims, 8);
  std::memcpy(&d1, dims + 8, 8);
  ASSERT_EQ(d0, 1536u);
  ASSERT_EQ(d1, 576u);
  std::memcpy(dims, &d1, 8);
  std::memcpy(dims + 8, &d0, 8);
  const std::string path = ::testing::TempDir() + "transposed_" + std::to_string(::getpid()) + ".gguf";
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  try {
    Model::load(path);
    FAIL() << "expected the transposed tensor to be refused";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(path + ": "), HasSubstr("tensor '" + name + "' has an unexpected shape")));
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace cf
