// Test helpers for the k3-repack / k3-verify integration tests: temp dirs, running
// the real binaries (with env, rlimits, kill -9), reading whole trees.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace k3test {

inline std::string Bin(const std::string& name) {
  return std::string(K3_BINARY_DIR) + "/bin/" + name;
}
inline std::string TinySnapshot() { return std::string(K3_TEST_DATA_DIR) + "/oracle/k3-tiny"; }

inline void RemoveTree(const std::string& p) {
  std::string cmd = "rm -rf '" + p + "'";
  if (std::system(cmd.c_str()) != 0) {
  }
}

// A fresh directory under $TMPDIR (or /tmp), removed with its contents at scope exit.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "k3repack") {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + tag + ".XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    char* p = ::mkdtemp(buf.data());
    path_ = p ? p : "";
  }
  ~TempDir() {
    if (!path_.empty()) RemoveTree(path_);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct SpawnOptions {
  std::vector<std::string> env;    // extra "K=V"
  std::string log;                 // stdout+stderr go here ("" = /dev/null)
  std::function<void()> pre_exec;  // runs in the child (rlimits, signals)
};

// In the forked child: env, log, pre_exec, then exec. On exec failure writes one
// byte to `report_fd` (when >= 0) and exits 127.
[[noreturn]] inline void ExecChild(const std::vector<std::string>& argv, const SpawnOptions& o,
                                   int report_fd) {
  for (const auto& e : o.env) ::putenv(const_cast<char*>(e.c_str()));
  int fd = ::open(o.log.empty() ? "/dev/null" : o.log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
  }
  if (o.pre_exec) o.pre_exec();
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  const char failed = 1;
  if (report_fd >= 0 && ::write(report_fd, &failed, 1) != 1) {
  }
  ::_exit(127);
}

inline pid_t Spawn(const std::vector<std::string>& argv, const SpawnOptions& o = {}) {
  pid_t pid = ::fork();
  if (pid == 0) ExecChild(argv, o, -1);
  return pid;
}

inline int Wait(pid_t pid);

// Like Spawn, but returns only once the child has exec'd the binary (a CLOEXEC
// pipe reaches EOF at exec), so a kill sent afterwards lands in the program, not
// in the forked copy of the test before exec. -1 (child reaped) when exec failed.
inline pid_t SpawnExeced(const std::vector<std::string>& argv, const SpawnOptions& o = {}) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ExecChild(argv, o, fds[1]);
  }
  ::close(fds[1]);
  char c;
  ssize_t n = -1;
  while (pid > 0 && (n = ::read(fds[0], &c, 1)) < 0 && errno == EINTR) {
  }
  ::close(fds[0]);
  if (pid > 0 && n != 0) {
    Wait(pid);
    return -1;
  }
  return pid;
}

// Exit status, or 128 + signal number.
inline int Wait(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return -1;
}

inline int Run(const std::vector<std::string>& argv, const SpawnOptions& o = {}) {
  return Wait(Spawn(argv, o));
}

inline std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline bool Exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

inline std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// name -> content of every file in `dir` (small trees only).
inline std::map<std::string, std::string> ReadTree(const std::string& dir) {
  std::map<std::string, std::string> t;
  for (const auto& n : ListDir(dir)) t[n] = ReadAll(dir + "/" + n);
  return t;
}

// Human-readable list of differences between two trees ("" when identical).
inline std::string TreeDiff(const std::map<std::string, std::string>& want,
                            const std::map<std::string, std::string>& got) {
  std::string d;
  for (const auto& [n, c] : want) {
    auto it = got.find(n);
    if (it == got.end())
      d += "missing " + n + "; ";
    else if (it->second != c)
      d += "differs " + n + "; ";
  }
  for (const auto& [n, c] : got) {
    if (!want.count(n)) d += "extra " + n + "; ";
  }
  return d;
}

}  // namespace k3test
