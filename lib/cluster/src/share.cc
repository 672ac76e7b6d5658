// Identity (model and build fingerprints), a rank's share of the expert bytes
// (which ranges, are they there, write a sparse copy), and the stats output.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "k3/cluster/cluster.h"
#include "k3/core/error.h"
#include "k3/core/file.h"
#include "k3/core/json_writer.h"
#include "k3/core/sys.h"
#include "k3/core/tool.h"
#include "wire.h"

namespace k3::cluster {

uint64_t ModelFingerprint(const Snapshot& snapshot) {
  std::string id = snapshot.config_json();
  for (const auto& f : snapshot.shards()) {
    id.push_back('\0');
    id += BaseName(f.path());
    const uint64_t size = f.file_size();
    id.append(reinterpret_cast<const char*>(&size), sizeof size);
  }
  return XXH64(id.data(), id.size(), 0);
}

uint64_t BuildId() {
  const std::string id = VersionLine("k3") + " wire " + std::to_string(wire::kVersion);
  return XXH64(id.data(), id.size(), 0);
}

std::vector<ShareRange> ShareRanges(const model::ExpertTable& table, const Placement& placement,
                                    int rank) {
  std::vector<ShareRange> out;
  const Snapshot& snap = table.snapshot();
  for (int64_t l = 0; l < placement.num_layers(); ++l) {
    for (int64_t e = 0; e < placement.num_experts(); ++e) {
      if (placement.owner(l, e) != rank || !table.present(l, e)) continue;
      for (int p = 0; p < model::kExpertParts; ++p) {
        const auto part = static_cast<model::ExpertPart>(p);
        ShareRange r;
        const std::string& path = table.path(l, e);
        for (size_t s = 0; s < snap.shards().size(); ++s) {
          if (snap.shards()[s].path() == path) r.shard = s;
        }
        r.offset = table.offset(l, e, part);
        r.length = table.part_bytes(part);
        out.push_back(r);
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const ShareRange& a, const ShareRange& b) {
    return a.shard != b.shard ? a.shard < b.shard : a.offset < b.offset;
  });
  // Merge adjacent ranges (an expert's six parts are usually back to back).
  std::vector<ShareRange> merged;
  for (const ShareRange& r : out) {
    if (!merged.empty() && merged.back().shard == r.shard &&
        merged.back().offset + merged.back().length == r.offset) {
      merged.back().length += r.length;
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

std::string CheckShare(const model::ExpertTable& table, const Placement& placement, int rank) {
  for (int64_t l = 0; l < placement.num_layers(); ++l) {
    for (int64_t e = 0; e < placement.num_experts(); ++e) {
      if (placement.owner(l, e) != rank || table.present(l, e)) continue;
      return "layer " + std::to_string(l) + " expert " + std::to_string(e) + ": tensor " +
             table.TensorName(l, e, model::ExpertPart::kW1p) + " is in no shard";
    }
  }
  const Snapshot& snap = table.snapshot();
  for (const ShareRange& r : ShareRanges(table, placement, rank)) {
    const auto& f = snap.shards()[r.shard];
    char where[96];
    std::snprintf(where, sizeof where, "bytes %llu..%llu of ",
                  static_cast<unsigned long long>(r.offset),
                  static_cast<unsigned long long>(r.offset + r.length));
    if (r.offset + r.length > f.file_size()) {
      return std::string(where) + f.path() + ": the file has " + std::to_string(f.file_size()) +
             " bytes";
    }
    // A prepared share is a sparse file: an owned range must hold data, not a
    // hole (a file system without SEEK_DATA reports data everywhere).
    const off_t data = lseek(f.fd(), static_cast<off_t>(r.offset), SEEK_DATA);
    if (data < 0 && errno == ENXIO)
      return std::string(where) + f.path() + ": a hole (not in this host's share)";
    if (data >= 0) {
      const off_t hole = lseek(f.fd(), static_cast<off_t>(r.offset), SEEK_HOLE);
      if (static_cast<uint64_t>(data) != r.offset ||
          (hole >= 0 && static_cast<uint64_t>(hole) < r.offset + r.length)) {
        return std::string(where) + f.path() + ": a hole (not in this host's share)";
      }
    }
  }
  return {};
}

uint64_t PrepareShareOrThrow(const std::string& model_dir, const Placement& placement, int rank,
                             const std::string& out_dir) {
  const Snapshot snap = Snapshot::OpenOrThrow(model_dir);
  const ModelConfig config =
      ModelConfig::ParseOrThrow(snap.config_json(), model_dir + "/config.json");
  const model::ExpertTable table(snap, config);
  if (const std::string m = CheckShare(table, placement, rank); !m.empty()) {
    throw Error(ErrorCode::kNotFound,
                "the source lacks bytes rank " + std::to_string(rank) + " owns: " + m, model_dir);
  }
  MakeDirs(out_dir);
  uint64_t written = 0;
  // Metadata (config, index, tokenizer): whole copies.
  for (const std::string& name : ListDirectoryOrThrow(model_dir)) {
    const std::string src = JoinPath(model_dir, name);
    if (name.size() > 12 && name.ends_with(".safetensors")) continue;
    struct stat st;
    if (stat(src.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const std::string bytes = ReadFileOrThrow(src, uint64_t{1} << 32);
    WriteFileAtomic(JoinPath(out_dir, name), bytes);
    written += bytes.size();
  }
  // Shards: full-size sparse files with the header and the owned ranges.
  const std::vector<ShareRange> ranges = ShareRanges(table, placement, rank);
  std::vector<std::byte> buf;
  for (size_t s = 0; s < snap.shards().size(); ++s) {
    const auto& f = snap.shards()[s];
    const std::string dst = JoinPath(out_dir, BaseName(f.path()));
    const std::string tmp = dst + ".tmp";
    UniqueFd out = OpenOrThrow(tmp, O_WRONLY | O_CREAT | O_TRUNC);
    if (ftruncate(out.get(), static_cast<off_t>(f.file_size())) != 0)
      ThrowErrno(errno, "ftruncate", tmp);
    auto copy = [&](uint64_t off, uint64_t len) {
      for (uint64_t done = 0; done < len;) {
        const uint64_t n = std::min<uint64_t>(len - done, 8u << 20);
        buf.resize(n);
        PreadFull(f.fd(), buf, off + done, f.path());
        PwriteFull(out.get(), buf, off + done, tmp);
        done += n;
        written += n;
      }
    };
    copy(0, f.header().data_offset());
    for (const ShareRange& r : ranges) {
      if (r.shard == s) copy(r.offset, r.length);
    }
    if (fsync(out.get()) != 0) ThrowErrno(errno, "fsync", tmp);
    out.Reset();
    if (rename(tmp.c_str(), dst.c_str()) != 0) ThrowErrno(errno, "rename", dst);
  }
  FsyncDirOrThrow(out_dir);
  return written;
}

void WriteClusterStatsJson(const ClusterStats& s, JsonWriter& j) {
  j.Key("cluster").BeginObject();
  j.Field("ranks", static_cast<int64_t>(s.ranks));
  j.Field("symmetric", s.symmetric);
  j.Field("reduced", s.reduced);
  char fp[20];
  std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(s.placement_fp));
  j.Field("placement_fingerprint", std::string(fp));
  j.Field("placement", s.placement);
  j.Field("layer_passes", s.layer_passes);
  j.Field("round_trips", s.round_trips);
  j.Field("exchange_s", s.exchange_s);
  j.Field("local_s", s.local_s);
  j.Field("bytes_sent", s.bytes_sent);
  j.Field("bytes_received", s.bytes_received);
  j.Field("failed_rank", static_cast<int64_t>(s.failed_rank));
  for (auto [name, ph] : {std::pair{"decode", &s.decode}, std::pair{"prefill", &s.prefill}}) {
    j.Key(name).BeginObject();
    j.Field("passes", ph->passes);
    j.Field("round_trips", ph->round_trips);
    j.Field("tokens", ph->tokens);
    j.Field("exchange_s", ph->exchange_s);
    j.Field("compute_s", ph->compute_s);
    j.Field("bytes", ph->bytes);
    j.EndObject();
  }
  j.Key("workers").BeginArray();
  for (const WorkerStats& w : s.workers) {
    j.BeginObject();
    j.Field("rank", static_cast<int64_t>(w.rank));
    j.Field("host", w.host);
    j.Field("owned_experts", w.owned_experts);
    j.Field("owned_bytes", w.owned_bytes);
    j.Field("exchanges", w.exchanges);
    j.Field("pairs", w.pairs);
    j.Field("bytes_sent", w.bytes_sent);
    j.Field("bytes_received", w.bytes_received);
    j.Field("expert_bytes_read", w.bytes_read);
    j.Field("expert_hits", w.hits);
    j.Field("expert_misses", w.misses);
    j.Field("expert_hit_rate", w.hit_rate());
    j.Field("compute_s", w.compute_s);
    j.EndObject();
  }
  j.EndArray();
  j.EndObject();
}

std::string RenderClusterMetrics(const ClusterStats& s) {
  std::string o;
  char line[256];
  auto metric = [&](const char* name, const char* type, const char* help) {
    std::snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
    o += line;
  };
  metric("k3_cluster_ranks", "gauge", "MPI ranks of the job");
  o += "k3_cluster_ranks " + std::to_string(s.ranks) + "\n";
  metric("k3_cluster_placement_info", "gauge", "placement fingerprint (label), always 1");
  std::snprintf(line, sizeof line,
                "k3_cluster_placement_info{fingerprint=\"%016llx\",symmetric=\"%d\"} 1\n",
                static_cast<unsigned long long>(s.placement_fp), s.symmetric ? 1 : 0);
  o += line;
  metric("k3_cluster_layer_passes_total", "counter", "MoE layer passes through the cluster");
  o += "k3_cluster_layer_passes_total " + std::to_string(s.layer_passes) + "\n";
  metric("k3_cluster_round_trips_total", "counter", "passes that waited for a worker");
  o += "k3_cluster_round_trips_total " + std::to_string(s.round_trips) + "\n";
  metric("k3_cluster_exchange_seconds_total", "counter", "first send to last answer, summed");
  std::snprintf(line, sizeof line, "k3_cluster_exchange_seconds_total %.6f\n", s.exchange_s);
  o += line;
  metric("k3_cluster_wire_bytes_total", "counter", "bytes on the wire by direction");
  o += "k3_cluster_wire_bytes_total{direction=\"out\"} " + std::to_string(s.bytes_sent) + "\n";
  o += "k3_cluster_wire_bytes_total{direction=\"in\"} " + std::to_string(s.bytes_received) + "\n";
  metric("k3_cluster_failed_rank", "gauge", "the rank that was lost, -1 if none");
  o += "k3_cluster_failed_rank " + std::to_string(s.failed_rank) + "\n";
  struct Col {
    const char* name;
    const char* type;
    const char* help;
    double (*get)(const WorkerStats&);
  };
  static const Col cols[] = {
      {"k3_cluster_worker_owned_experts", "gauge", "routed experts the rank owns",
       [](const WorkerStats& w) { return static_cast<double>(w.owned_experts); }},
      {"k3_cluster_worker_pairs_total", "counter", "(token, rank) pairs the rank computed",
       [](const WorkerStats& w) { return static_cast<double>(w.pairs); }},
      {"k3_cluster_worker_expert_bytes_read_total", "counter",
       "expert bytes the rank read from disk",
       [](const WorkerStats& w) { return static_cast<double>(w.bytes_read); }},
      {"k3_cluster_worker_expert_hit_rate", "gauge", "the rank's expert cache hit rate",
       [](const WorkerStats& w) { return w.hit_rate(); }},
      {"k3_cluster_worker_compute_seconds_total", "counter", "seconds inside the rank's executor",
       [](const WorkerStats& w) { return w.compute_s; }},
  };
  for (const Col& c : cols) {
    metric(c.name, c.type, c.help);
    for (const WorkerStats& w : s.workers) {
      std::snprintf(line, sizeof line, "%s{rank=\"%d\"} %.9g\n", c.name, w.rank, c.get(w));
      o += line;
    }
  }
  return o;
}

std::string DescribeClusterStats(const ClusterStats& s) {
  char head[256];
  std::snprintf(head, sizeof head,
                "cluster: %d ranks%s | %llu layer passes, %llu round trips, exchange %.3f s | wire "
                "%s out, %s in",
                s.ranks, s.symmetric ? " (symmetric)" : "",
                static_cast<unsigned long long>(s.layer_passes),
                static_cast<unsigned long long>(s.round_trips), s.exchange_s,
                FormatBytes(s.bytes_sent).c_str(), FormatBytes(s.bytes_received).c_str());
  std::string out = head;
  for (const WorkerStats& w : s.workers) {
    char line[200];
    std::snprintf(line, sizeof line, " | rank %d: %lld experts, %llu pairs, read %s, hit %.1f%%",
                  w.rank, static_cast<long long>(w.owned_experts),
                  static_cast<unsigned long long>(w.pairs), FormatBytes(w.bytes_read).c_str(),
                  100.0 * w.hit_rate());
    out += line;
  }
  return out;
}

}  // namespace k3::cluster
