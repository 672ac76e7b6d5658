// The official `openai` npm client against `mpirun -np 3 k3-run serve
// --cluster` on the tiny model: the same answers, streamed and not, as a
// single-host server given the same seeds (the cluster is bit-exact), and
// /metrics showing the cluster.
//
// usage: node openai_cluster_test.mjs NODE_MODULES K3_RUN MODEL_DIR
import { Check, load, startServer, stopServer } from "../server/js/lib.mjs";

const [modules, k3Run, modelDir] = process.argv.slice(2);
const { default: OpenAI } = await load(modules, "openai");
const check = new Check();
const serveArgs = ["serve", modelDir, "--host", "127.0.0.1", "--port", "0", "--model-id", "k3-tiny",
                   "--threads", "1", "--ckpt-slots", "0", "--sampling", "free"];
const mpirun = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader",
                "-x", "K3_LOG", "-x", "OMP_NUM_THREADS", "-np", "3", k3Run, ...serveArgs, "--cluster"];
const env = { OMP_NUM_THREADS: "1" };

async function answers(port) {
  const client = new OpenAI({ apiKey: "unused", baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 });
  const out = [];
  for (const seed of [3, 8]) {
    const messages = [{ role: "user", content: `Count to ${seed}.` }];
    const plain = await client.chat.completions.create({ model: "k3-tiny", messages, max_tokens: 12, seed,
                                                         temperature: 0.8 });
    out.push({ content: plain.choices[0].message.content, reasoning: plain.choices[0].message.reasoning_content,
               usage: plain.usage.completion_tokens });
    const stream = await client.chat.completions.create({ model: "k3-tiny", messages, max_tokens: 12, seed,
                                                          temperature: 0.8, stream: true });
    let text = "", reasoning = "";
    for await (const chunk of stream) {
      for (const ch of chunk.choices) {
        text += ch.delta?.content || "";
        reasoning += ch.delta?.reasoning_content || "";
      }
    }
    out.push({ content: text, reasoning, usage: plain.usage.completion_tokens });
  }
  return out;
}

const one = await startServer(k3Run, serveArgs, env);
let single;
try {
  single = await answers(one.port);
} finally {
  await stopServer(one);
}
const cl = await startServer("mpirun", mpirun, env);
try {
  const multi = await answers(cl.port);
  check.ok(multi.length === single.length, "as many answers");
  for (let i = 0; i < single.length; ++i) {
    check.ok(multi[i].content === single[i].content && multi[i].reasoning === single[i].reasoning,
             `answer ${i}: the cluster's text equals one host's`);
    check.ok(single[i].usage > 0, `answer ${i}: tokens generated`);
  }
  const text = await (await fetch(`http://127.0.0.1:${cl.port}/metrics`)).text();
  check.ok(/k3_cluster_ranks 3/.test(text), "/metrics: k3_cluster_ranks 3");
  check.ok(/k3_cluster_worker_pairs_total\{rank="1"\} [1-9]/.test(text), "/metrics: rank 1 computed pairs");
  check.ok(/k3_cluster_round_trips_total [1-9]/.test(text), "/metrics: round trips counted");
} finally {
  await stopServer(cl);
}
process.exit(check.done());
