// Corrupt-file corpus: every named corruption of a small valid safetensors file or
// snapshot directory must be refused with its own specific k3::ErrorCode, and the
// error must point at the file, tensor and byte offset that are wrong. Valid edge
// cases (padding, empty tensors, metadata placement) must keep being accepted.
#include <doctest/doctest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "k3/container/safetensors.h"
#include "k3/container/snapshot.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3_test_support.h"

using namespace k3;

namespace {

std::string TempDir() { return test::MakeTempDir("k3_corpus_test"); }

// Raw file bytes: u64 LE length, header text, data section.
std::string Assemble(std::string_view header, std::string_view data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  out.append(header);
  out.append(data);
  return out;
}

std::string Entry(std::string_view name, std::string_view dtype, std::string_view shape,
                  uint64_t b, uint64_t e) {
  return "\"" + std::string(name) + "\":{\"dtype\":\"" + std::string(dtype) + "\",\"shape\":" +
         std::string(shape) + ",\"data_offsets\":[" + std::to_string(b) + "," +
         std::to_string(e) + "]}";
}

// The valid base file: a F32 [2,3] (24 bytes), b U8 [5] (5 bytes), c BF16 [4] (8 bytes).
constexpr uint64_t kBaseData = 37;
std::string BaseHeader() {
  return "{\"__metadata__\":{\"format\":\"pt\"}," + Entry("a", "F32", "[2,3]", 0, 24) + "," +
         Entry("b", "U8", "[5]", 24, 29) + "," + Entry("c", "BF16", "[4]", 29, 37) + "}";
}
std::string Data(uint64_t n) {
  std::string d(n, '\0');
  for (uint64_t i = 0; i < n; ++i) d[i] = static_cast<char>(i * 7 + 1);
  return d;
}
std::string Tensors(const std::vector<std::string>& entries) {
  std::string h = "{";
  for (size_t i = 0; i < entries.size(); ++i) h += (i ? "," : "") + entries[i];
  return h + "}";
}

enum class FileCorruption {
  kEmptyFile,
  kTruncatedLength,
  kHeaderLengthPastEof,
  kHugeHeaderLength,
  kMaxU64HeaderLength,
  kZeroHeaderLength,
  kInvalidJson,
  kTruncatedJson,
  kNotObject,
  kEntryNotObject,
  kMissingDtype,
  kDtypeNotString,
  kUnknownDtype,
  kLowercaseDtype,
  kMissingShape,
  kShapeNotArray,
  kFractionalDim,
  kNegativeDim,
  kTooManyDims,
  kShapeBytesMismatch,
  kOverflowingShape,
  kHugeCounts,
  kOffsetsPastEof,
  kBeginAfterEnd,
  kOffsetsNotPair,
  kNegativeOffset,
  kBoolOffset,
  kOverlap,
  kIdenticalOffsets,
  kHole,
  kHoleAtStart,
  kTrailingGarbage,
  kDuplicateName,
  kDuplicateMetadata,
  kNonUtf8Name,
  kMetadataNotObject,
  kMetadataValueNotString,
  kNulPadding,
  kCount,
};

struct Case {
  const char* name;
  std::string bytes;
  ErrorCode code;
  std::string object;          // expected Error::object(), "" = don't care
  int64_t offset = -2;         // expected Error::offset(), -2 = don't care
  std::string message_part;    // substring of what(), "" = don't care
};

Case MakeCase(FileCorruption c) {
  const std::string data = Data(kBaseData);
  const std::string header = BaseHeader();
  auto file = [&](std::string_view h) { return Assemble(h, data); };
  const int64_t data_at = 8 + static_cast<int64_t>(header.size());
  switch (c) {
    case FileCorruption::kEmptyFile:
      return {"empty file", "", ErrorCode::kTruncated, "", 0, "too short"};
    case FileCorruption::kTruncatedLength:
      return {"truncated length", std::string("\x10\0\0\0\0", 5), ErrorCode::kTruncated, "", 0,
              "too short"};
    case FileCorruption::kHeaderLengthPastEof: {
      std::string b = file(header);
      uint64_t n = header.size() + data.size() + 1;  // one byte past EOF
      for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(n >> (8 * i));
      return {"header length past EOF", b, ErrorCode::kTruncated, "", 0, "past the end"};
    }
    case FileCorruption::kHugeHeaderLength: {
      std::string b = file(header);
      uint64_t n = kMaxHeaderBytes + 1;
      for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(n >> (8 * i));
      return {"header length above cap", b, ErrorCode::kCorrupt, "", 0, "limit"};
    }
    case FileCorruption::kMaxU64HeaderLength: {
      std::string b = file(header);
      for (int i = 0; i < 8; ++i) b[i] = '\xff';
      return {"header length 2^64-1", b, ErrorCode::kCorrupt, "", 0, "limit"};
    }
    case FileCorruption::kZeroHeaderLength:
      return {"zero header length", Assemble("", data), ErrorCode::kCorrupt, "", 8, "JSON"};
    case FileCorruption::kInvalidJson:
      return {"invalid JSON", file("{\"a\":{\"dtype\":F32}}"), ErrorCode::kCorrupt, "", 8,
              "not valid JSON"};
    case FileCorruption::kTruncatedJson:
      return {"truncated JSON", file(header.substr(0, header.size() - 3)), ErrorCode::kCorrupt, "",
              8, "not valid JSON"};
    case FileCorruption::kNotObject:
      return {"JSON not an object", file("[1,2,3]"), ErrorCode::kCorrupt, "", 8, "not an object"};
    case FileCorruption::kEntryNotObject:
      return {"entry not an object", Assemble("{\"a\":5}", ""), ErrorCode::kCorrupt, "a", 8,
              "not an object"};
    case FileCorruption::kMissingDtype:
      return {"missing dtype", Assemble("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", "x"),
              ErrorCode::kCorrupt, "a", 8, "dtype"};
    case FileCorruption::kDtypeNotString:
      return {"dtype not a string",
              Assemble("{\"a\":{\"dtype\":1,\"shape\":[1],\"data_offsets\":[0,1]}}", "x"),
              ErrorCode::kCorrupt, "a", 8, "dtype"};
    case FileCorruption::kUnknownDtype:
      return {"unknown dtype", Assemble(Tensors({Entry("a", "F12", "[1]", 0, 1)}), "x"),
              ErrorCode::kUnsupported, "a", 8, "unknown dtype 'F12'"};
    case FileCorruption::kLowercaseDtype:
      return {"lowercase dtype", Assemble(Tensors({Entry("a", "u8", "[1]", 0, 1)}), "x"),
              ErrorCode::kUnsupported, "a", 8, "unknown dtype 'u8'"};
    case FileCorruption::kMissingShape:
      return {"missing shape", Assemble("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", "x"),
              ErrorCode::kCorrupt, "a", 8, "shape"};
    case FileCorruption::kShapeNotArray:
      return {"shape not an array",
              Assemble("{\"a\":{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}}", "x"),
              ErrorCode::kCorrupt, "a", 8, "shape"};
    case FileCorruption::kFractionalDim:
      return {"fractional dim", Assemble(Tensors({Entry("a", "U8", "[1.5]", 0, 1)}), "x"),
              ErrorCode::kCorrupt, "a", 8, "shape"};
    case FileCorruption::kNegativeDim:
      return {"negative dim", Assemble(Tensors({Entry("a", "U8", "[-1]", 0, 1)}), "x"),
              ErrorCode::kCorrupt, "a", 8, "non-negative"};
    case FileCorruption::kTooManyDims:
      return {"17 dims", Assemble(Tensors({Entry("a", "U8", "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]",
                                                 0, 1)}),
                                  "x"),
              ErrorCode::kCorrupt, "a", 8, "dimensions"};
    case FileCorruption::kShapeBytesMismatch: {
      std::string h = Tensors({Entry("a", "F32", "[2,3]", 0, 24), Entry("b", "U8", "[6]", 24, 29),
                               Entry("c", "BF16", "[4]", 29, 37)});
      return {"shape x dtype != bytes", file(h), ErrorCode::kCorrupt, "b",
              8 + static_cast<int64_t>(h.size()) + 24, "6 bytes but data_offsets span 5"};
    }
    case FileCorruption::kOverflowingShape: {
      std::string h = Tensors({Entry("a", "F32", "[4294967296,4294967296,16]", 0, 24)});
      return {"shape product overflows", Assemble(h, Data(24)), ErrorCode::kCorrupt, "a", 8,
              "overflow"};
    }
    case FileCorruption::kHugeCounts: {
      // Fits in u64 (2^40 bytes) but the file holds 24: must fail before anything allocates.
      std::string h = Tensors({Entry("a", "U8", "[1099511627776]", 0, 1099511627776ull)});
      return {"huge element count", Assemble(h, Data(24)), ErrorCode::kTruncated, "a", -2,
              "data section holds only 24"};
    }
    case FileCorruption::kOffsetsPastEof: {
      std::string h = Tensors({Entry("a", "F32", "[2,3]", 0, 24), Entry("b", "U8", "[5]", 24, 29),
                               Entry("c", "BF16", "[4]", 29, 37)});
      return {"offsets past EOF", Assemble(h, Data(33)), ErrorCode::kTruncated, "c",
              8 + static_cast<int64_t>(h.size()) + 29, "ends at 37"};
    }
    case FileCorruption::kBeginAfterEnd: {
      std::string h = Tensors({Entry("a", "U8", "[0]", 5, 4), Entry("b", "U8", "[5]", 0, 5)});
      return {"begin > end", Assemble(h, Data(5)), ErrorCode::kCorrupt, "a", -2, "begin 5 > end 4"};
    }
    case FileCorruption::kOffsetsNotPair:
      return {"data_offsets with one entry",
              Assemble("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1]}}", "x"),
              ErrorCode::kCorrupt, "a", 8, "data_offsets"};
    case FileCorruption::kNegativeOffset:
      return {"negative offset",
              Assemble("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", "x"),
              ErrorCode::kCorrupt, "a", 8, "data_offsets"};
    case FileCorruption::kBoolOffset:
      return {"boolean offset",
              Assemble("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[false,1]}}", "x"),
              ErrorCode::kCorrupt, "a", 8, "data_offsets"};
    case FileCorruption::kOverlap: {
      std::string h = Tensors({Entry("a", "F32", "[2,3]", 0, 24), Entry("b", "U8", "[5]", 20, 25),
                               Entry("c", "BF16", "[6]", 25, 37)});
      return {"overlap", file(h), ErrorCode::kCorrupt, "b", 8 + static_cast<int64_t>(h.size()) + 20,
              "overlaps"};
    }
    case FileCorruption::kIdenticalOffsets: {
      std::string h = Tensors({Entry("a", "U8", "[4]", 0, 4), Entry("b", "U8", "[4]", 0, 4)});
      return {"two tensors on the same bytes", Assemble(h, Data(4)), ErrorCode::kCorrupt, "", -2,
              "overlaps"};
    }
    case FileCorruption::kHole: {
      std::string h = Tensors({Entry("a", "F32", "[2,3]", 0, 24), Entry("b", "U8", "[4]", 25, 29),
                               Entry("c", "BF16", "[4]", 29, 37)});
      return {"hole", file(h), ErrorCode::kCorrupt, "b", 8 + static_cast<int64_t>(h.size()) + 24,
              "hole of 1 bytes"};
    }
    case FileCorruption::kHoleAtStart: {
      std::string h = Tensors({Entry("a", "U8", "[4]", 4, 8)});
      return {"hole at start", Assemble(h, Data(8)), ErrorCode::kCorrupt, "a",
              8 + static_cast<int64_t>(h.size()), "hole of 4 bytes"};
    }
    case FileCorruption::kTrailingGarbage:
      return {"trailing garbage", Assemble(header, data + "junk"), ErrorCode::kCorrupt, "",
              data_at + 37, "4 bytes of trailing data"};
    case FileCorruption::kDuplicateName: {
      std::string h = Tensors({Entry("a", "F32", "[2,3]", 0, 24), Entry("a", "U8", "[5]", 24, 29),
                               Entry("c", "BF16", "[4]", 29, 37)});
      return {"duplicate name", file(h), ErrorCode::kCorrupt, "a", 8, "duplicate"};
    }
    case FileCorruption::kDuplicateMetadata: {
      std::string h = "{\"__metadata__\":{},\"__metadata__\":{}," +
                      Entry("a", "U8", "[1]", 0, 1) + "}";
      return {"__metadata__ twice", Assemble(h, "x"), ErrorCode::kCorrupt, "__metadata__", 8,
              "duplicate"};
    }
    case FileCorruption::kNonUtf8Name:
      return {"non-UTF-8 name", Assemble(Tensors({Entry("a\xff\xfe", "U8", "[1]", 0, 1)}), "x"),
              ErrorCode::kCorrupt, "", 8, "UTF-8"};
    case FileCorruption::kMetadataNotObject:
      return {"__metadata__ not an object",
              Assemble("{\"__metadata__\":\"pt\"," + Entry("a", "U8", "[1]", 0, 1) + "}", "x"),
              ErrorCode::kCorrupt, "__metadata__", 8, "object of strings"};
    case FileCorruption::kMetadataValueNotString:
      return {"__metadata__ value not a string",
              Assemble("{\"__metadata__\":{\"format\":1}," + Entry("a", "U8", "[1]", 0, 1) + "}",
                       "x"),
              ErrorCode::kCorrupt, "__metadata__", 8, "'format' is not a string"};
    case FileCorruption::kNulPadding: {
      std::string h = header;
      h.append(3, '\0');
      return {"NUL padding instead of spaces", file(h), ErrorCode::kCorrupt, "", 8, "JSON"};
    }
    case FileCorruption::kCount:
      break;
  }
  FAIL("unhandled corruption");
  return {};
}

// Writes `bytes` to a fresh file and expects OpenOrThrow to fail exactly as `c` says.
void ExpectRefused(const std::string& dir, const Case& c) {
  std::string path = JoinPath(dir, "corrupt.safetensors");
  WriteFileAtomic(path, c.bytes);
  try {
    SafetensorsFile::OpenOrThrow(path);
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK_MESSAGE(e.code() == c.code, std::string(e.what()));
    CHECK_MESSAGE(e.path() == path, std::string(e.what()));
    if (!c.object.empty()) CHECK_MESSAGE(e.object() == c.object, std::string(e.what()));
    if (c.offset != -2) CHECK_MESSAGE(e.offset() == c.offset, std::string(e.what()));
    if (!c.message_part.empty()) {
      CHECK_MESSAGE(std::string(e.what()).find(c.message_part) != std::string::npos, std::string(e.what()));
    }
  }
}

SafetensorsFile OpenBytes(const std::string& dir, const std::string& bytes) {
  std::string path = JoinPath(dir, "ok.safetensors");
  WriteFileAtomic(path, bytes);
  return SafetensorsFile::OpenOrThrow(path);
}

}  // namespace

TEST_CASE("base file of the corpus is valid") {
  std::string dir = TempDir();
  SafetensorsFile f = OpenBytes(dir, Assemble(BaseHeader(), Data(kBaseData)));
  REQUIRE(f.tensors().size() == 3);
  CHECK(f.Find("b")->nbytes() == 5);
}

TEST_CASE("every named file corruption is refused with its own code") {
  std::string dir = TempDir();
  for (int i = 0; i < static_cast<int>(FileCorruption::kCount); ++i) {
    Case c = MakeCase(static_cast<FileCorruption>(i));
    INFO("corruption: " << std::string(c.name));
    ExpectRefused(dir, c);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("header parser refuses what the file reader refuses, without a file") {
  // The fuzzer drives ParseOrThrow directly; make sure it reports like the file path does.
  CHECK_THROWS_AS(SafetensorsHeader::ParseOrThrow("{", 0, "mem"), Error);
  try {
    SafetensorsHeader::ParseOrThrow(Tensors({Entry("x", "U8", "[3]", 0, 3)}), 2, "mem");
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kTruncated);
    CHECK(e.object() == "x");
    CHECK(e.path() == "mem");
  }
}

TEST_CASE("valid edge cases are accepted") {
  std::string dir = TempDir();
  SUBCASE("header padded with spaces to a multiple of 8") {
    std::string h = BaseHeader();
    while ((8 + h.size()) % 8) h += ' ';
    h += "        ";  // and a whole extra block of padding
    SafetensorsFile f = OpenBytes(dir, Assemble(h, Data(kBaseData)));
    CHECK(f.header().data_offset() % 8 == 0);
    CHECK(f.tensors().size() == 3);
  }
  SUBCASE("unpadded header") {
    std::string h = BaseHeader() + " ";
    if ((8 + h.size()) % 8 == 0) h += " ";
    SafetensorsFile f = OpenBytes(dir, Assemble(h, Data(kBaseData)));
    CHECK(f.tensors().size() == 3);
  }
  SUBCASE("empty tensors anywhere, scalars, zero-size files") {
    std::string h = Tensors({Entry("e0", "F32", "[0]", 0, 0), Entry("s", "F32", "[]", 0, 4),
                             Entry("e1", "BF16", "[3,0,2]", 4, 4), Entry("b", "U8", "[2]", 4, 6),
                             Entry("e2", "U8", "[0]", 6, 6)});
    SafetensorsFile f = OpenBytes(dir, Assemble(h, Data(6)));
    CHECK(f.tensors().size() == 5);
    CHECK(f.Find("s")->numel() == 1);
    CHECK(f.Find("e1")->nbytes() == 0);
    CHECK(f.Find("e2")->begin == 6);
  }
  SUBCASE("no tensors at all") {
    SafetensorsFile f = OpenBytes(dir, Assemble("{}", ""));
    CHECK(f.tensors().empty());
    SafetensorsFile g = OpenBytes(dir, Assemble("{\"__metadata__\":{}}      ", ""));
    CHECK(g.tensors().empty());
  }
  SUBCASE("__metadata__ after the tensors, header order != offset order") {
    std::string h = "{" + Entry("c", "BF16", "[4]", 29, 37) + "," + Entry("a", "F32", "[2,3]", 0, 24) +
                    "," + Entry("b", "U8", "[5]", 24, 29) +
                    ",\"__metadata__\":{\"format\":\"pt\",\"note\":\"\\u00e9\"}}";
    SafetensorsFile f = OpenBytes(dir, Assemble(h, Data(kBaseData)));
    REQUIRE(f.tensors().size() == 3);
    CHECK(f.tensors()[0].name == "a");  // kept in data-offset order
    REQUIRE(f.header().metadata().size() == 2);
    CHECK(f.header().metadata()[1].second == "\xc3\xa9");
  }
  SUBCASE("UTF-8 names and every dtype") {
    std::string h = Tensors({Entry("\xe4\xb8\xad", "F64", "[1]", 0, 8), Entry("b", "BOOL", "[1]", 8, 9),
                             Entry("c", "F8_E4M3", "[1]", 9, 10), Entry("d", "I64", "[1]", 10, 18),
                             Entry("e", "F8_E8M0", "[2]", 18, 20)});
    SafetensorsFile f = OpenBytes(dir, Assemble(h, Data(20)));
    CHECK(f.Find("\xe4\xb8\xad") != nullptr);
  }
}

// ---------------------------------------------------------------------------
// Snapshot directories.

namespace {

enum class DirCorruption {
  kNotADirectory,
  kMissingConfig,
  kIndexInvalidJson,
  kIndexNotObject,
  kIndexNoWeightMap,
  kIndexEmptyWeightMap,
  kIndexValueNotString,
  kIndexDuplicateTensor,
  kIndexMissingShard,
  kIndexDotDotShard,
  kIndexAbsoluteShard,
  kIndexSubdirShard,
  kIndexEmptyShardName,
  kIndexWrongShard,
  kTensorNotInIndex,
  kIndexTensorNotInShard,
  kCorruptShard,
  kNoShardsNoIndex,
  kTensorInTwoShardsNoIndex,
  kCount,
};

// A valid two-shard snapshot: s1 holds x, y; s2 holds z.
struct DirFixture {
  std::string dir;
  std::string index;  // the valid index text
};

std::string Shard(const std::vector<std::pair<std::string, uint64_t>>& u8_tensors) {
  std::vector<std::string> entries;
  uint64_t off = 0;
  for (const auto& [name, n] : u8_tensors) {
    entries.push_back(Entry(name, "U8", "[" + std::to_string(n) + "]", off, off + n));
    off += n;
  }
  return Assemble(Tensors(entries), Data(off));
}

DirFixture MakeValidDir() {
  DirFixture f;
  f.dir = TempDir();
  WriteFileAtomic(JoinPath(f.dir, "config.json"), "{\"text_config\":{}}");
  WriteFileAtomic(JoinPath(f.dir, "s1.safetensors"), Shard({{"x", 3}, {"y", 4}}));
  WriteFileAtomic(JoinPath(f.dir, "s2.safetensors"), Shard({{"z", 5}}));
  f.index =
      "{\"metadata\":{\"total_size\":12},\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":"
      "\"s1.safetensors\",\"z\":\"s2.safetensors\"}}";
  WriteFileAtomic(JoinPath(f.dir, "model.safetensors.index.json"), f.index);
  return f;
}

struct DirCase {
  const char* name;
  ErrorCode code;
  std::string object;
  std::string path_part;     // substring of Error::path()
  std::string message_part;  // substring of what()
  std::string open_dir = {};  // directory to open; defaults to the fixture's
};

DirCase Apply(DirCorruption c, const DirFixture& f) {
  auto index = [&](const std::string& text) {
    WriteFileAtomic(JoinPath(f.dir, "model.safetensors.index.json"), text);
  };
  auto replace = [&](std::string from, std::string to) {
    std::string t = f.index;
    size_t at = t.find(from);
    REQUIRE(at != std::string::npos);
    t.replace(at, from.size(), to);
    index(t);
  };
  const std::string index_name = "model.safetensors.index.json";
  switch (c) {
    case DirCorruption::kNotADirectory:
      return {"not a directory", ErrorCode::kNotFound, "", "nope", "does not exist",
              JoinPath(f.dir, "nope")};
    case DirCorruption::kMissingConfig:
      ::unlink(JoinPath(f.dir, "config.json").c_str());
      return {"missing config.json", ErrorCode::kNotFound, "", "config.json", ""};
    case DirCorruption::kIndexInvalidJson:
      index("{\"weight_map\":{\"x\":");
      return {"index not JSON", ErrorCode::kCorrupt, "", index_name, "not valid JSON"};
    case DirCorruption::kIndexNotObject:
      index("[\"s1.safetensors\"]");
      return {"index not an object", ErrorCode::kCorrupt, "", index_name, "weight_map"};
    case DirCorruption::kIndexNoWeightMap:
      index("{\"metadata\":{}}");
      return {"index without weight_map", ErrorCode::kCorrupt, "", index_name, "weight_map"};
    case DirCorruption::kIndexEmptyWeightMap:
      index("{\"weight_map\":{}}");
      return {"index with empty weight_map", ErrorCode::kCorrupt, "", index_name, "no tensors"};
    case DirCorruption::kIndexValueNotString:
      replace("\"z\":\"s2.safetensors\"", "\"z\":2");
      return {"weight_map value not a string", ErrorCode::kCorrupt, "z", index_name, "not a string"};
    case DirCorruption::kIndexDuplicateTensor:
      replace("\"z\":\"s2.safetensors\"", "\"z\":\"s2.safetensors\",\"x\":\"s2.safetensors\"");
      return {"tensor listed twice in the index", ErrorCode::kCorrupt, "x", index_name, "twice"};
    case DirCorruption::kIndexMissingShard:
      replace("\"z\":\"s2.safetensors\"", "\"z\":\"s3.safetensors\"");
      return {"index names a missing shard", ErrorCode::kNotFound, "", "s3.safetensors", "missing"};
    case DirCorruption::kIndexDotDotShard:
      replace("\"z\":\"s2.safetensors\"", "\"z\":\"../s2.safetensors\"");
      return {"index shard with ../", ErrorCode::kCorrupt, "z", index_name, "../s2.safetensors"};
    case DirCorruption::kIndexAbsoluteShard:
      replace("\"z\":\"s2.safetensors\"", "\"z\":\"/etc/passwd\"");
      return {"index shard with absolute path", ErrorCode::kCorrupt, "z", index_name, "/etc/passwd"};
    case DirCorruption::kIndexSubdirShard:
      replace("\"z\":\"s2.safetensors\"", "\"z\":\"sub/s2.safetensors\"");
      return {"index shard in a subdirectory", ErrorCode::kCorrupt, "z", index_name, "plain file"};
    case DirCorruption::kIndexEmptyShardName:
      replace("\"z\":\"s2.safetensors\"", "\"z\":\"\"");
      return {"index shard name empty", ErrorCode::kCorrupt, "z", index_name, "plain file"};
    case DirCorruption::kIndexWrongShard:
      replace("\"y\":\"s1.safetensors\"", "\"y\":\"s2.safetensors\"");
      return {"index maps a tensor to the wrong shard", ErrorCode::kCorrupt, "y", "s1.safetensors",
              "s2.safetensors"};
    case DirCorruption::kTensorNotInIndex:
      replace(",\"y\":\"s1.safetensors\"", "");
      return {"tensor in a shard but not in the index", ErrorCode::kCorrupt, "y", "s1.safetensors",
              "not in the index"};
    case DirCorruption::kIndexTensorNotInShard:
      replace("\"z\":\"s2.safetensors\"", "\"z\":\"s2.safetensors\",\"w\":\"s2.safetensors\"");
      return {"index maps a tensor that is not there", ErrorCode::kCorrupt, "w", "s2.safetensors",
              "not there"};
    case DirCorruption::kCorruptShard: {
      std::string bytes = Shard({{"z", 5}});
      bytes.pop_back();
      WriteFileAtomic(JoinPath(f.dir, "s2.safetensors"), bytes);
      return {"a shard is truncated", ErrorCode::kTruncated, "z", "s2.safetensors", ""};
    }
    case DirCorruption::kNoShardsNoIndex:
      ::unlink(JoinPath(f.dir, index_name).c_str());
      ::unlink(JoinPath(f.dir, "s1.safetensors").c_str());
      ::unlink(JoinPath(f.dir, "s2.safetensors").c_str());
      return {"no index and no shards", ErrorCode::kNotFound, "", f.dir, "no model.safetensors"};
    case DirCorruption::kTensorInTwoShardsNoIndex:
      ::unlink(JoinPath(f.dir, index_name).c_str());
      WriteFileAtomic(JoinPath(f.dir, "s2.safetensors"), Shard({{"z", 5}, {"x", 1}}));
      return {"tensor in two shards (no index)", ErrorCode::kCorrupt, "x", "s2.safetensors",
              "two shards"};
    case DirCorruption::kCount:
      break;
  }
  FAIL("unhandled corruption");
  return {};
}

}  // namespace

TEST_CASE("base snapshot directory of the corpus is valid") {
  DirFixture f = MakeValidDir();
  Snapshot s = Snapshot::OpenOrThrow(f.dir);
  CHECK(s.num_tensors() == 3);
  CHECK(s.prefix().empty());
  CHECK(s.index_total_size().value() == 12);
  auto z = s.FindOrThrow("z");
  CHECK(z.offset == z.file->header().data_offset());
}

TEST_CASE("every named snapshot corruption is refused with its own code") {
  for (int i = 0; i < static_cast<int>(DirCorruption::kCount); ++i) {
    DirFixture f = MakeValidDir();
    DirCase c = Apply(static_cast<DirCorruption>(i), f);
    INFO("corruption: " << std::string(c.name));
    try {
      Snapshot::OpenOrThrow(c.open_dir.empty() ? f.dir : c.open_dir);
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK_MESSAGE(e.code() == c.code, std::string(e.what()));
      if (!c.object.empty()) CHECK_MESSAGE(e.object() == c.object, std::string(e.what()));
      if (!c.path_part.empty()) {
        CHECK_MESSAGE(e.path().find(c.path_part) != std::string::npos, std::string(e.what()));
      }
      if (!c.message_part.empty()) {
        CHECK_MESSAGE(std::string(e.what()).find(c.message_part) != std::string::npos, std::string(e.what()));
      }
    }
    std::filesystem::remove_all(f.dir);
  }
}

TEST_CASE("shards may live in extra directories, searched by basename") {
  DirFixture f = MakeValidDir();
  std::string other = TempDir();
  std::string from = JoinPath(f.dir, "s2.safetensors");
  std::string to = JoinPath(other, "s2.safetensors");
  REQUIRE(::rename(from.c_str(), to.c_str()) == 0);
  CHECK_THROWS_AS(Snapshot::OpenOrThrow(f.dir), Error);
  Snapshot::Options opt;
  opt.extra_dirs = {other};
  Snapshot s = Snapshot::OpenOrThrow(f.dir, opt);
  CHECK(s.FindOrThrow("z").file->path() == to);
}

TEST_CASE("lookups survive copies and moves of headers and snapshots") {
  // Name lookups view the names stored in the tensor list; copies must rebuild
  // them and moves must keep them valid.
  std::string dir = TempDir();
  std::optional<SafetensorsHeader> copy;
  {
    SafetensorsFile f = OpenBytes(dir, Assemble(BaseHeader(), Data(kBaseData)));
    copy = f.header();
  }
  REQUIRE(copy->Find("b") != nullptr);
  CHECK(copy->Find("b")->nbytes() == 5);
  SafetensorsHeader moved = std::move(*copy);
  copy.reset();
  REQUIRE(moved.Find("c") != nullptr);
  CHECK(moved.Find("c")->dtype == DType::kBF16);

  DirFixture fx = MakeValidDir();
  std::optional<Snapshot> a(Snapshot::OpenOrThrow(fx.dir));
  Snapshot b = std::move(*a);
  a.reset();
  auto z = b.FindOrThrow("z");
  CHECK(z.info->name == "z");
  CHECK(b.FindExact(std::string("y")).has_value());
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(fx.dir);
}

TEST_CASE("an empty tensor inside another tensor's bytes is an overlap") {
  std::string dir = TempDir();
  std::string h = Tensors({Entry("a", "U8", "[8]", 0, 8), Entry("e", "U8", "[0]", 4, 4)});
  ExpectRefused(dir, {"empty tensor inside another", Assemble(h, Data(8)), ErrorCode::kCorrupt, "e",
                      -2, "overlaps"});
  std::filesystem::remove_all(dir);
}
