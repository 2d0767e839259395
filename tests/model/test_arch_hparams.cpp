// Hyperparameters from GGUF metadata (arch_registry.cpp): what the shapes of issue 11 need
// (head size from attention.key_length, qwen2/qwen3 flags) and the clear refusal of RoPE
// scaling declared in metadata, which the runtime does not implement.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "gguf_writer.h"
#include "model/arch.h"
#include "model/gguf.h"

namespace cf {
namespace {

using test::GgufWriter;
using ::testing::HasSubstr;

// A metadata-only file of the given architecture (Qwen3-0.6B's attention geometry).
GgufWriter qwen3_like(const std::string& arch) {
  GgufWriter w(3);
  w.add_string("general.architecture", arch);
  w.add_u32(arch + ".block_count", 2);
  w.add_u32(arch + ".embedding_length", 1024);
  w.add_u32(arch + ".feed_forward_length", 3072);
  w.add_u32(arch + ".attention.head_count", 16);
  w.add_u32(arch + ".attention.head_count_kv", 8);
  w.add_u32(arch + ".attention.key_length", 128);
  w.add_u32(arch + ".vocab_size", 10);
  return w;
}

std::unique_ptr<GgufFile> open_bytes(GgufWriter& w, const std::string& tag) {
  const std::string path = ::testing::TempDir() + "hparams_" + tag + "_" + std::to_string(::getpid()) + ".gguf";
  GgufWriter::write_file(path, w.build());
  auto f = GgufFile::open(path);
  std::filesystem::remove(path);  // the mapping stays valid
  return f;
}

TEST(ArchHparams, HeadSizeFromKeyLengthAndArchFlags) {
  auto w = qwen3_like("qwen3");
  auto f = open_bytes(w, "qwen3");
  const ModelHparams h = read_hparams(*f, *find_arch("qwen3"));
  EXPECT_EQ(h.head_dim, 128);  // not 1024 / 16
  EXPECT_EQ(h.q_dim(), 2048);
  EXPECT_EQ(h.kv_dim(), 1024);
  EXPECT_TRUE(h.qk_norm);
  EXPECT_FALSE(h.qkv_bias);
  EXPECT_EQ(h.rope_style, RopeStyle::Neox);
  EXPECT_TRUE(h.rope_freq_factors.empty()) << "factors come from the rope_freqs.weight tensor, not metadata";
  EXPECT_TRUE(find_arch("qwen2")->qkv_bias);
}

TEST(ArchHparams, MetadataRopeScalingIsRefusedByName) {
  for (const char* type : {"linear", "yarn", "longrope"}) {
    auto w = qwen3_like("llama");
    w.add_string("llama.rope.scaling.type", type);
    w.add_f32("llama.rope.scaling.factor", 8.0f);
    auto f = open_bytes(w, type);
    try {
      read_hparams(*f, *find_arch("llama"));
      ADD_FAILURE() << type << " accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr(std::string("RoPE scaling type '") + type + "'"));
    }
  }
  auto w = qwen3_like("llama");
  w.add_string("llama.rope.scaling.type", "none");
  auto f = open_bytes(w, "none");
  EXPECT_NO_THROW(read_hparams(*f, *find_arch("llama")));
}

}  // namespace
}  // namespace cf
