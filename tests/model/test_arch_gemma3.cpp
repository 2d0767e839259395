// The gemma3 hyperparameter reader on synthetic headers: the window pattern (metadata or
// llama.cpp's default), per-layer RoPE bases, and one clear error for each combination it
// cannot run.
#include <gtest/gtest.h>

#include <cmath>

#include "gguf_writer.h"
#include "model/arch.h"
#include "model/gguf.h"

namespace cf {
namespace {

test::GgufWriter gemma_header(int layers = 8) {
  test::GgufWriter w;
  w.add_string("general.architecture", "gemma3")
      .add_u32("gemma3.block_count", static_cast<uint32_t>(layers))
      .add_u32("gemma3.embedding_length", 64)
      .add_u32("gemma3.feed_forward_length", 128)
      .add_u32("gemma3.attention.head_count", 2)
      .add_u32("gemma3.attention.head_count_kv", 1)
      .add_u32("gemma3.attention.key_length", 32)
      .add_u32("gemma3.attention.value_length", 32)
      .add_u32("gemma3.vocab_size", 100)
      .add_f32("gemma3.rope.freq_base", 1e6f);
  return w;
}

ModelHparams read(test::GgufWriter& w) {
  const auto bytes = w.build();
  auto f = GgufFile::from_bytes(bytes.data(), bytes.size(), "gemma.gguf");
  return read_hparams(*f, *find_arch("gemma3"));
}

std::string error_of(test::GgufWriter& w) {
  try {
    read(w);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(Gemma3Arch, DefaultPatternIsEverySixthLayerGlobal) {
  auto w = gemma_header(12);
  w.add_u32("gemma3.attention.sliding_window", 512);
  const ModelHparams h = read(w);
  EXPECT_EQ(h.sliding_window, 512);
  for (int l = 0; l < 12; ++l) EXPECT_EQ(h.is_local(l), l != 5 && l != 11) << l;
  EXPECT_EQ(h.window_of(0), 512);
  EXPECT_EQ(h.window_of(5), 0);
  EXPECT_EQ(h.rope_base_of(0), 10000.f);  // llama.cpp's default local base
  EXPECT_EQ(h.rope_base_of(5), 1e6f);
  EXPECT_FLOAT_EQ(h.embed_scale, 8.f);    // sqrt(64)
  EXPECT_FLOAT_EQ(h.attn_scale, 1.f / std::sqrt(32.f));
  EXPECT_TRUE(h.post_norms);
  EXPECT_TRUE(h.qk_norm);
  EXPECT_EQ(h.rope_style, RopeStyle::Neox);
  EXPECT_EQ(h.activation, FfnActivation::GeLU);
}

TEST(Gemma3Arch, PatternAndLocalBaseFromMetadata) {
  auto w = gemma_header(4);
  w.add_u32("gemma3.attention.sliding_window", 128)
      .add_f32("gemma3.rope.freq_base_swa", 5000.f)
      .add_array<uint8_t>("gemma3.attention.sliding_window_pattern", GgufValueType::BOOL, {1, 0, 0, 1});
  const ModelHparams h = read(w);
  EXPECT_TRUE(h.is_local(0));
  EXPECT_FALSE(h.is_local(1));
  EXPECT_TRUE(h.is_local(3));
  EXPECT_EQ(h.rope_base_of(3), 5000.f);
  auto p = gemma_header(6);
  p.add_u32("gemma3.attention.sliding_window", 128).add_u32("gemma3.attention.sliding_window_pattern", 3);
  const ModelHparams q = read(p);
  for (int l = 0; l < 6; ++l) EXPECT_EQ(q.is_local(l), l % 3 != 2) << l;
}

TEST(Gemma3Arch, NoWindowMeansAllGlobal) {
  auto w = gemma_header();
  const ModelHparams h = read(w);
  EXPECT_FALSE(h.has_local_layers());
  for (int l = 0; l < 8; ++l) EXPECT_EQ(h.window_of(l), 0);
}

TEST(Gemma3Arch, UnsupportedCombinationsAreOneClearError) {
  {
    auto w = gemma_header();
    w.add_string("gemma3.rope.scaling.type", "yarn");
    EXPECT_NE(error_of(w).find("rope.scaling.type 'yarn'"), std::string::npos) << error_of(w);
  }
  {
    auto w = gemma_header();
    w.add_f32("gemma3.rope.scaling.factor", 8.f);
    EXPECT_NE(error_of(w).find("RoPE scaling"), std::string::npos) << error_of(w);
  }
  {
    auto w = gemma_header();
    w.add_u32("gemma3.attention.sliding_window", 512).add_array<uint8_t>(
        "gemma3.attention.sliding_window_pattern", GgufValueType::BOOL, {1, 0});
    EXPECT_NE(error_of(w).find("array of 8 booleans"), std::string::npos) << error_of(w);
  }
  {
    auto w = gemma_header();
    w.add_u32("gemma3.attention.sliding_window", 512).add_u32("gemma3.attention.sliding_window_pattern", 99);
    EXPECT_NE(error_of(w).find("sliding_window_pattern out of range"), std::string::npos) << error_of(w);
  }
  {
    auto w = gemma_header();
    w.add_f32("gemma3.final_logit_softcapping", -1.f);
    EXPECT_NE(error_of(w).find("final_logit_softcapping"), std::string::npos) << error_of(w);
  }
}

}  // namespace
}  // namespace cf
