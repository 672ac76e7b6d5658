// Shared by the npm-client tests: start a server binary on a free loopback
// port (it prints "listening on http://127.0.0.1:PORT"), stop it by PID, load
// the pinned packages from the cache folder npm-install.sh filled.
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

export async function load(modulesDir, name) {
  const req = createRequire(modulesDir + "/resolve.js");
  return import(pathToFileURL(req.resolve(name)).href);
}

export function startServer(cmd, args, env = {}) {
  return new Promise((resolve, reject) => {
    const proc = spawn(cmd, args, { env: { ...process.env, K3_LOG: "warn", ...env }, stdio: ["ignore", "pipe", "pipe"] });
    let log = "";
    const onData = (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m && !proc.k3port) {
        proc.k3port = Number(m[1]);
        waitHealthy(proc.k3port).then(() => resolve({ proc, port: proc.k3port, log: () => log }), reject);
      }
    };
    proc.stdout.on("data", onData);
    proc.stderr.on("data", onData);
    proc.on("exit", (code, sig) => {
      if (!proc.k3port) reject(new Error(`server exited ${code}: ${log}`));
      else if (!proc.k3stopping) console.log(`server on port ${proc.k3port} exited ${code} ${sig ?? ""}: ${log.slice(-1500)}`);
    });
  });
}

async function waitHealthy(port) {
  for (let i = 0; i < 6000; ++i) {
    try {
      const r = await fetch(`http://127.0.0.1:${port}/health`);
      if (r.status === 200) return;
    } catch (e) { /* not up yet */ }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("server never became healthy");
}

export function stopServer(s) {
  return new Promise((resolve) => {
    if (s.proc.exitCode !== null) return resolve();
    s.proc.on("exit", () => resolve());
    s.proc.k3stopping = true;  // no "exited" line for a stop we asked for
    process.kill(s.proc.pid, "SIGTERM");
  });
}

export async function metric(port, name) {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  for (const line of text.split("\n")) if (line.startsWith(name + " ")) return Number(line.split(" ")[1]);
  throw new Error("no metric " + name);
}

// Waits for a condition (a counter reaching a value), not for a time.
export async function waitMetric(port, name, atLeast) {
  for (let i = 0; i < 3000; ++i) {
    if ((await metric(port, name)) >= atLeast) return;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error(`${name} stayed below ${atLeast}`);
}

export class Check {
  constructor() { this.failed = []; this.count = 0; }
  ok(cond, what) {
    this.count++;
    if (!cond) { this.failed.push(what); console.log("FAIL:", what); }
    return cond;
  }
  done() {
    console.log(`${this.count - this.failed.length}/${this.count} checks passed`);
    return this.failed.length ? 1 : 0;
  }
}
