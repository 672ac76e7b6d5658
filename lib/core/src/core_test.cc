#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "k3/core/default_init.h"
#include "k3/core/direct_io.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/json_writer.h"
#include "k3/core/numeric.h"
#include "k3/core/sys.h"
#include "k3_test_support.h"

using namespace k3;

namespace {
std::string TempDir() { return test::MakeTempDir("k3_core_test"); }
}  // namespace

TEST_CASE("Error formats path, offset, object and code") {
  Error e(ErrorCode::kCorrupt, "bad thing", "/x/y.safetensors", 42, "tensor.a");
  CHECK(std::string(e.what()) == "/x/y.safetensors: offset 42: 'tensor.a': bad thing [corrupt]");
  CHECK(ExitCodeFor(ErrorCode::kOk) == 0);
  CHECK(ExitCodeFor(ErrorCode::kCorrupt) != 0);
  CHECK(std::string(e.WithObject("other").what()).find("tensor.a") != std::string::npos);
}

TEST_CASE("BF16 and F16 conversions") {
  CHECK(Bf16ToF32(0x3f80) == 1.0f);
  CHECK(Bf16ToF32(0xbf80) == -1.0f);
  CHECK(F32ToBf16(1.0f) == 0x3f80);
  // round half to even: 1 + 2^-8 is exactly halfway between bf16 1.0 and next.
  CHECK(F32ToBf16(1.00390625f) == 0x3f80);
  CHECK(F32ToBf16(1.01171875f) == 0x3f82);
  CHECK(F16ToF32(0x3c00) == 1.0f);
  CHECK(F16ToF32(0xc000) == -2.0f);
  CHECK(F16ToF32(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(F16ToF32(0x7c00) == INFINITY);
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // monotonic over all finite positives
    if (h > 0) CHECK_MESSAGE(F16ToF32(h) > F16ToF32(h - 1), h);
  }
}

TEST_CASE("checked arithmetic") {
  CHECK(CheckedMul(1ull << 32, 1ull << 31).value() == (1ull << 63));
  CHECK_FALSE(CheckedMul(1ull << 32, 1ull << 32).has_value());
  CHECK_FALSE(CheckedAdd(~0ull, 1).has_value());
}

TEST_CASE("AtomicFileWriter publishes only on commit") {
  std::string dir = TempDir();
  std::string path = JoinPath(dir, "out.bin");
  {
    AtomicFileWriter w(path);
    w.Write(std::string_view("hello"));
    CHECK_FALSE(PathExists(path));
    CHECK(PathExists(w.temp_path()));
  }  // abandoned: temp removed, nothing published
  CHECK_FALSE(PathExists(path));
  {
    AtomicFileWriter w(path);
    w.Write(std::string_view("hello"));
    w.Commit();
    CHECK_FALSE(PathExists(w.temp_path()));
  }
  CHECK(ReadFileOrThrow(path, 100) == "hello");
  WriteFileAtomic(path, "bye");
  CHECK(ReadFileOrThrow(path, 100) == "bye");
  CHECK_THROWS_AS(ReadFileOrThrow(path, 2), Error);
}

TEST_CASE("PreallocateOrThrow sizes the file; a descriptor it cannot use is an error naming the file") {
  std::string dir = TempDir();
  std::string path = JoinPath(dir, "pre.bin");
  {
    AtomicFileWriter w(path);
    // The test directory is on a filesystem with fallocate (ext4, tmpfs); one
    // without it returns false and leaves the file as it was.
    if (PreallocateOrThrow(w.fd(), 3 << 20, w.temp_path())) {
      CHECK(FileSizeOrThrow(w.fd(), w.temp_path()) == uint64_t{3} << 20);
    }
    CHECK(PreallocateOrThrow(w.fd(), 0, w.temp_path()));  // nothing to allocate
  }
  UniqueFd ro(::open(dir.c_str(), O_RDONLY | O_DIRECTORY));
  REQUIRE(ro.valid());
  try {
    PreallocateOrThrow(ro.get(), 4096, dir);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("fallocate 4096 bytes") != std::string::npos);
    CHECK(std::string(e.what()).find(dir) != std::string::npos);
  }
}

TEST_CASE("AtomicFileWriter names the caller's path, not its temp file, when it cannot create it") {
  try {
    k3::AtomicFileWriter w("/no/such/dir/l.bin");
    FAIL("created");
  } catch (const k3::Error& e) {
    CHECK(e.code() == k3::ErrorCode::kNotFound);
    CHECK(e.path() == "/no/such/dir/l.bin");
    CHECK(std::string(e.what()).find(".tmp.") == std::string::npos);
    CHECK(std::string(e.what()).find("directory does not exist") != std::string::npos);
  }
}

TEST_CASE("AtomicFileWriter never writes through a link planted at its temp or final name") {
  const std::string dir = TempDir();
  const std::string path = JoinPath(dir, "victim.out");
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  // 28 planted links, each at the temp name the next writer will use: to a
  // file, a missing file, a directory, itself.
  int untouched = 0;
  for (int i = 0; i < 28; ++i) {
    const std::string target = JoinPath(dir, "target." + std::to_string(i));
    WriteFileAtomic(target, "precious " + std::to_string(i));
    const std::string link_to = i % 4 == 1   ? JoinPath(dir, "absent." + std::to_string(i))
                                : i % 4 == 2 ? dir
                                : i % 4 == 3 ? temp
                                             : target;
    REQUIRE(::symlink(link_to.c_str(), temp.c_str()) == 0);
    WriteFileAtomic(path, "payload " + std::to_string(i));
    CHECK(ReadFileOrThrow(path, 100) == "payload " + std::to_string(i));
    if (ReadFileOrThrow(target, 100) == "precious " + std::to_string(i)) ++untouched;
    CHECK_FALSE(PathExists(JoinPath(dir, "absent." + std::to_string(i))));
    struct stat st {};
    CHECK(::lstat(temp.c_str(), &st) != 0);  // the link is gone, nothing left
  }
  CHECK(untouched == 28);
  // A stale regular temp file (a killed process with our pid) is replaced, not appended to.
  WriteFileAtomic(JoinPath(dir, "stale.src"), "old bytes that are much longer");
  REQUIRE(::rename(JoinPath(dir, "stale.src").c_str(), temp.c_str()) == 0);
  WriteFileAtomic(path, "new");
  CHECK(ReadFileOrThrow(path, 100) == "new");
  // A link planted at the final name is replaced by the file, its target kept.
  const std::string target = JoinPath(dir, "final-target");
  WriteFileAtomic(target, "keep");
  REQUIRE(::unlink(path.c_str()) == 0);
  REQUIRE(::symlink(target.c_str(), path.c_str()) == 0);
  WriteFileAtomic(path, "mine");
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK(ReadFileOrThrow(path, 100) == "mine");
  CHECK(ReadFileOrThrow(target, 100) == "keep");
}

TEST_CASE("OpenRegularFileOrThrow: FIFOs, directories and links are refused at once") {
  const std::string dir = TempDir();
  const std::string file = JoinPath(dir, "f");
  WriteFileAtomic(file, "abc");
  struct stat st {};
  UniqueFd fd = OpenRegularFileOrThrow(file, &st);
  CHECK(st.st_size == 3);
  CHECK((::fcntl(fd.get(), F_GETFL) & O_NONBLOCK) == 0);
  const std::string fifo = JoinPath(dir, "fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  const std::string link = JoinPath(dir, "link");
  REQUIRE(::symlink(file.c_str(), link.c_str()) == 0);
  // A FIFO without a writer would block a plain open() forever: this returns.
  for (const auto& [p, what] : {std::pair{fifo, "a FIFO"}, std::pair{dir, "a directory"},
                                std::pair{link, "a symbolic link"}}) {
    try {
      OpenRegularFileOrThrow(p);
      FAIL("opened " << p);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kUnsupported);
      CHECK(e.path() == p);
      CHECK(std::string(e.what()).find(what) != std::string::npos);
    }
  }
  try {
    OpenRegularFileOrThrow(JoinPath(dir, "missing"));
    FAIL("opened a missing file");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kNotFound);
  }
}

TEST_CASE("ReopenDirect never follows a link planted at the name, even to the same file") {
  const std::string dir = TempDir();
  const std::string name = JoinPath(dir, "shard.tmp");
  WriteFileAtomic(name, std::string(8192, 'x'));
  UniqueFd fd = OpenOrThrow(name, O_RDONLY);
  {
    UniqueFd direct = ReopenDirect(name, fd.get(), O_RDONLY);
    // A filesystem without O_DIRECT (tmpfs) refuses either way: nothing to prove there.
    if (!direct.valid() && errno == EINVAL) {
      MESSAGE("O_DIRECT refused in " << dir << "; the link case is not reached");
      return;
    }
    REQUIRE(direct.valid());
  }
  // The file moved aside and a link to it planted at its name: the inode
  // check alone passes (the link leads to the same file), so only a reopen
  // that refuses links keeps a writer from following whatever the link names.
  const std::string moved = JoinPath(dir, "elsewhere");
  REQUIRE(::rename(name.c_str(), moved.c_str()) == 0);
  REQUIRE(::symlink(moved.c_str(), name.c_str()) == 0);
  errno = 0;
  UniqueFd through_link = ReopenDirect(name, fd.get(), O_RDONLY);
  CHECK_FALSE(through_link.valid());
  CHECK(errno == ELOOP);
}

TEST_CASE("PreadFull reports truncation with the offset") {
  std::string dir = TempDir();
  std::string path = JoinPath(dir, "f");
  WriteFileAtomic(path, "0123456789");
  UniqueFd fd = OpenOrThrow(path, O_RDONLY);
  std::byte buf[8];
  PreadFull(fd.get(), buf, 2, path);
  CHECK(static_cast<char>(buf[0]) == '2');
  try {
    PreadFull(fd.get(), buf, 5, path);
    FAIL("expected truncation");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kTruncated);
    CHECK(e.offset() == 5);
    CHECK(e.path() == path);
  }
  CHECK_THROWS_AS(OpenOrThrow(JoinPath(dir, "missing"), O_RDONLY), Error);
}

TEST_CASE("MappedFile maps the whole file") {
  std::string dir = TempDir();
  std::string path = JoinPath(dir, "m");
  WriteFileAtomic(path, "abcdef");
  MappedFile m = MappedFile::OpenOrThrow(path);
  REQUIRE(m.size() == 6);
  CHECK(static_cast<char>(m.data()[5]) == 'f');
}

TEST_CASE("JsonWriter escapes and nests") {
  JsonWriter w;
  w.BeginObject().Field("a", 1).Field("s", std::string("q\"\n\x01")).Key("arr").BeginArray()
      .Int(1).Double(0.5).Bool(true).Null().EndArray().EndObject();
  CHECK(w.str() == R"({"a":1,"s":"q\"\n\u0001","arr":[1,0.5,true,null]})");
  std::string bad;
  AppendJsonString(bad, std::string_view("\xff" "a", 2));
  CHECK(bad == "\"\\ufffda\"");
}

TEST_CASE("environment parsing names the variable on error") {
  setenv("K3_TEST_INT", "12x", 1);
  try {
    GetEnvInt("K3_TEST_INT", 0);
    FAIL("expected error");
  } catch (const Error& e) {
    CHECK(e.object() == "K3_TEST_INT");
  }
  setenv("K3_TEST_INT", "12", 1);
  CHECK(GetEnvInt("K3_TEST_INT", 0) == 12);
  CHECK(GetEnvBool("K3_TEST_UNSET_X", true));
  CHECK(MemAvailableBytes() > 0);
  CHECK(PeakRssBytes() > 0);
}

TEST_CASE("ListDirectory and MakeDirs") {
  char tmpl[] = "/tmp/k3_core_dirs_XXXXXX";
  const std::string root = ::mkdtemp(tmpl);
  const std::string deep = root + "/a/b/c";
  k3::MakeDirs(deep);
  CHECK(k3::IsDirectory(deep));
  k3::MakeDirs(deep);  // already there: fine
  k3::WriteFileAtomic(root + "/a/zz", "x");
  k3::WriteFileAtomic(root + "/a/aa", "y");
  CHECK(k3::ListDirectory(root + "/a") == std::vector<std::string>{"aa", "b", "zz"});
  CHECK(k3::ListDirectory(root + "/nope").empty());
  CHECK(k3::ListDirectoryOrThrow(root + "/a") == std::vector<std::string>{"aa", "b", "zz"});
  try {
    k3::ListDirectoryOrThrow(root + "/nope");
    FAIL("listed a missing directory");
  } catch (const k3::Error& e) {
    CHECK(e.path() == root + "/nope");  // the caller's directory, named
  }
  CHECK_THROWS_AS(k3::MakeDirs(root + "/a/zz"), k3::Error);        // a file is in the way
  CHECK_THROWS_AS(k3::MakeDirs(root + "/a/zz/under"), k3::Error);  // ENOTDIR
  CHECK(std::system(("rm -rf '" + root + "'").c_str()) == 0);
}

TEST_CASE("docs/errors.md's table is the exit code of every error code") {
  // The table rows read "| name[, name] | exit | meaning |"; every ErrorCode
  // must be listed once, with the exit code ExitCodeFor really returns.
  const std::string doc = k3::ReadFileOrThrow(std::string(K3_TEST_DATA_DIR) + "/../../docs/errors.md", 1 << 20);
  std::map<std::string, int> listed;
  size_t at = 0;
  while ((at = doc.find("\n| ", at)) != std::string::npos) {
    const size_t eol = doc.find('\n', at + 1);
    const std::string row = doc.substr(at + 3, eol - at - 3);
    at = eol;
    const size_t bar = row.find(" | ");
    if (bar == std::string::npos) continue;
    const std::string names = row.substr(0, bar), exit = row.substr(bar + 3, row.find(" |", bar + 3) - bar - 3);
    if (exit.empty() || exit.find_first_not_of("0123456789") != std::string::npos) continue;
    for (size_t b = 0; b <= names.size();) {
      size_t e = names.find(", ", b);
      if (e == std::string::npos) e = names.size();
      listed[names.substr(b, e - b)] = std::stoi(exit);
      b = e + 2;
    }
  }
  for (int c = 0; c <= static_cast<int>(k3::ErrorCode::kUnavailable); ++c) {
    const auto code = static_cast<k3::ErrorCode>(c);
    const std::string name(k3::ErrorCodeName(code));
    CAPTURE(name);
    REQUIRE(listed.count(name) == 1);
    CHECK(listed[name] == k3::ExitCodeFor(code));
  }
}

namespace {

// Hands out memory pre-filled with 0xA5 bytes, so what a vector writes on
// resize() is visible (only through the object representation, as bytes).
template <typename T>
struct PatternAllocator : std::allocator<T> {
  PatternAllocator() = default;
  template <typename U>
  PatternAllocator(const PatternAllocator<U>&) {}
  template <typename U>
  struct rebind {
    using other = PatternAllocator<U>;
  };
  T* allocate(size_t n) {
    T* p = std::allocator<T>::allocate(n);
    std::memset(static_cast<void*>(p), 0xA5, n * sizeof(T));
    return p;
  }
};

template <typename Vec>
bool AllBytesAre(const Vec& v, unsigned char b) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(v[0]); ++i) {
    if (p[i] != b) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("DefaultInitVector: resize(n) writes nothing; explicit values still land") {
  // The same base allocator with and without the default-init layer: plain
  // value-initialisation zero-fills, the checkpoint buffers' allocator does not.
  std::vector<float, PatternAllocator<float>> plain;
  plain.resize(1000);
  CHECK(AllBytesAre(plain, 0x00));
  std::vector<float, k3::DefaultInitAllocator<float, PatternAllocator<float>>> lazy;
  lazy.resize(1000);
  CHECK(AllBytesAre(lazy, 0xA5));
  // Everything else is std::vector's.
  k3::DefaultInitVector<float> v;
  v.resize(4, 2.5f);
  v.push_back(-1.0f);
  CHECK(v == k3::DefaultInitVector<float>{2.5f, 2.5f, 2.5f, 2.5f, -1.0f});
  k3::DefaultInitVector<float> copy = v;
  CHECK(copy == v);
  v.assign(3, 0.0f);
  CHECK(AllBytesAre(v, 0x00));
  CHECK(v.size() == 3);
}
