// The store never leaves its folder and keeps what it writes private (issue 17, item 4).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "kv/chunk_store.h"
#include "kv/store_paths.h"
#include "kv_test_util.h"

namespace cf {
namespace {

namespace fs = std::filesystem;
using test::synthetic_cache;
using test::tiny_hparams;
using test::tiny_key;

ChunkStoreOptions options_for(const std::string& dir) {
  ChunkStoreOptions o;
  o.dir = dir;
  o.model = StoreModel{test::kTinyFingerprint, tiny_hparams()};
  o.report = [](const std::string&) {};
  return o;
}

unsigned mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 0777;
}

// `chunkfuse chunks rm --all` used to follow a symlinked folder inside the store and delete
// the files it pointed at.
TEST(StoreContainment, RemoveAllListAndVerifyNeverFollowSymlinks) {
  test::TempDir root;
  const std::string store_dir = root.path() + "/store", outside = root.path() + "/precious";
  fs::create_directories(outside);
  const ChunkKey a = tiny_key(1, 3);
  {
    ChunkStore s(options_for(store_dir));
    s.put(synthetic_cache(a, tiny_hparams()));
  }
  // A real cache file outside, reachable through a two-hex-digit symlinked folder and a
  // symlinked file: both look exactly like store entries.
  const std::string victim = outside + "/" + a.id() + ".cfkv";
  fs::copy_file(ChunkStore(options_for(store_dir)).path_for(a.id()), victim);
  fs::create_directory_symlink(outside, store_dir + "/ff");
  fs::create_symlink(victim, store_dir + "/" + a.id().substr(0, 2) + "/ffff.cfkv");

  ChunkStore s(options_for(store_dir));
  EXPECT_EQ(s.list().size(), 1u);
  EXPECT_EQ(s.verify().checked, 1u);
  EXPECT_EQ(s.remove_all(), 1u);
  EXPECT_TRUE(fs::exists(victim)) << "remove_all deleted a file outside the store";
  EXPECT_TRUE(fs::is_symlink(store_dir + "/ff"));  // the link itself is left for its owner
}

TEST(StoreContainment, RemoveAndPutDoNotGoThroughASymlinkedFolder) {
  test::TempDir root;
  const std::string store_dir = root.path() + "/store", outside = root.path() + "/elsewhere";
  fs::create_directories(outside);
  const ChunkKey a = tiny_key(2, 4);
  ChunkStore s(options_for(store_dir));
  const std::string path = s.path_for(a.id());
  fs::create_directory_symlink(outside, fs::path(path).parent_path());
  std::ofstream(outside + "/" + fs::path(path).filename().string()) << "not ours";
  EXPECT_FALSE(s.remove(a.id()));
  EXPECT_TRUE(fs::exists(outside + "/" + fs::path(path).filename().string()));
  EXPECT_THROW(s.put(synthetic_cache(a, tiny_hparams())), CacheFileError);
  EXPECT_EQ(fs::file_size(outside + "/" + fs::path(path).filename().string()), 8u);
}

TEST(StoreContainment, FilesArePrivate) {
  test::TempDir root;
  const std::string store_dir = root.path() + "/store";
  const ChunkKey a = tiny_key(3, 5);
  ChunkStore s(options_for(store_dir));
  s.put(synthetic_cache(a, tiny_hparams()));
  const std::string path = s.path_for(a.id());
  EXPECT_EQ(mode_of(store_dir), 0700u);
  EXPECT_EQ(mode_of(fs::path(path).parent_path().string()), 0700u);
  EXPECT_EQ(mode_of(path), 0600u);
}

// DELETE /v1/chunks/..x removed ..x.cfkv from the folder above the store (issue 29 item 8):
// the store itself refuses any id that is not 32 lower-case hex digits, whoever calls it.
TEST(StoreContainment, OnlyKeyIdsNameFiles) {
  test::TempDir root;
  const std::string store_dir = root.path() + "/store";
  const std::string above = root.path() + "/..x.cfkv";
  std::ofstream(above) << "not the store's";
  ChunkStore s(options_for(store_dir));
  const ChunkKey k = tiny_key(3, 5);
  const std::string nul_id = k.id().substr(0, 10) + std::string(1, '\0') + k.id().substr(11);
  std::string upper = k.id();
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const std::string& bad : {std::string("..x"), std::string("../../etc/passwd"), nul_id, upper,
                                 k.id() + "0", k.id().substr(1), std::string("")}) {
    EXPECT_THROW(s.remove(bad), std::invalid_argument) << bad;
    EXPECT_THROW(s.path_for(bad), std::invalid_argument) << bad;
    EXPECT_THROW(s.tiers(bad), std::invalid_argument) << bad;
  }
  EXPECT_TRUE(fs::exists(above));
  try {
    s.remove("..x");
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("..x"), std::string::npos) << e.what();
  }
  // A well-formed id the store does not hold is simply not there.
  EXPECT_FALSE(s.remove(k.id()));
  s.put(synthetic_cache(k, tiny_hparams()));
  EXPECT_TRUE(s.remove(k.id()));
}

// The one atomic writer (issue 29 item 11): private whatever the umask, nothing left behind,
// and a link planted at the target name is replaced, never written through.
TEST(StoreContainment, AtomicPrivateWrite) {
  test::TempDir root;
  const std::string target = root.path() + "/index.json", elsewhere = root.path() + "/elsewhere";
  std::ofstream(elsewhere) << "keep";
  fs::create_symlink(elsewhere, target);
  const mode_t old = ::umask(0);
  write_private_file_atomic(target, std::string_view("{\"a\":1}"));
  ::umask(old);
  EXPECT_TRUE(is_real_file(target));
  EXPECT_EQ(mode_of(target), 0600u);
  std::ifstream in(elsewhere);
  std::string kept;
  in >> kept;
  EXPECT_EQ(kept, "keep");
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(root.path())) n += e.path().filename().string()[0] == '.';
  EXPECT_EQ(n, 0u);  // no temp file left
  EXPECT_THROW(write_private_file_atomic(root.path() + "/missing/x", std::string_view("x")), std::runtime_error);
}

// Issue 59: temp files a killed writer left (".<name>.tmp.<pid>.<16 hex>", the names
// write_private_file_atomic makes) are removed at start-up; nothing else is.
TEST(StoreContainment, StaleTempFilesOfOursAreRemovedAndNothingElse) {
  const std::string hex = "0123456789abcdef";
  EXPECT_EQ(private_temp_file_pid(".serve-chunks.json.tmp.42." + hex), 42);
  for (const std::string& bad : std::vector<std::string>{"serve-chunks.json.tmp.42." + hex, ".x.tmp.42.0123456789ABCDEF", ".x.tmp.42.0123",
                                ".x.tmp.." + hex, ".x.tmp.4a2." + hex, ".tmp.42." + hex, ".x.tmp.42." + hex + "0"})
    EXPECT_EQ(private_temp_file_pid(bad), -1) << bad;

  test::TempDir root;
  const fs::path store = fs::path(root.path()) / "store";
  fs::create_directories(store / "ab");
  fs::create_directories(root.path() + "/elsewhere");
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  waitpid(dead, nullptr, 0);
  const auto started = fs::file_time_type::clock::now();
  auto make = [&](const fs::path& p, std::chrono::seconds age) {
    std::ofstream(p) << "half a write";
    fs::last_write_time(p, started - age);
  };
  const std::string d = std::to_string(dead), me = std::to_string(::getpid());
  const std::vector<fs::path> stale = {store / (".serve-chunks.json.tmp." + d + "." + hex),
                                       store / "ab" / (".ab01.cfkv.tmp." + d + "." + hex),
                                       store / (".scores.json.tmp." + me + "." + hex)};  // this pid, before it started
  const std::vector<fs::path> kept = {store / ("x.cfkv.tmp." + d + "." + hex), store / "ab" / "ab01.cfkv",
                                      store / (".x.tmp.1." + hex),  // pid 1 is alive: its writer may be too
                                      fs::path(root.path()) / "elsewhere" / (".y.tmp." + d + "." + hex)};
  for (const auto& p : stale) make(p, std::chrono::hours(1));
  for (const auto& p : kept) make(p, std::chrono::hours(1));
  const fs::path fresh = store / (".new.tmp." + d + "." + hex);
  make(fresh, std::chrono::seconds(-10));  // written after start-up
  fs::create_symlink(root.path() + "/elsewhere", store / "cd");  // a linked folder is not walked
  const fs::path via_link = fs::path(root.path()) / "elsewhere" / (".z.tmp." + d + "." + hex);
  make(via_link, std::chrono::hours(1));
  const fs::path link = store / (".l.tmp." + d + "." + hex);
  fs::create_symlink(via_link, link);  // a link with our name: neither it nor its target removed

  EXPECT_EQ(remove_stale_temp_files(store, started), stale.size());
  for (const auto& p : stale) EXPECT_FALSE(fs::exists(p)) << p;
  for (const auto& p : kept) EXPECT_TRUE(fs::exists(p)) << p;
  EXPECT_TRUE(fs::exists(fresh));
  EXPECT_TRUE(fs::exists(via_link));
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(remove_stale_temp_files(store, started), 0u);
}

}  // namespace
}  // namespace cf
