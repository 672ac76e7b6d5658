// Regenerates zod.json: JSON Schemas as zod 4's z.toJSONSchema emits them, for
// the tool inputs Claude Code declares (re-expressed from the published
// sdk-tools.d.ts of @anthropic-ai/claude-code 2.1.332; Claude Code builds its
// tool schemas with zod) and for the zod types the AI SDK / LangChain users
// write most. Run: node gen_zod.mjs /path/to/zod/package > zod.json
import { pathToFileURL } from "node:url";
const zodDir = process.argv[2];
const { z } = await import(pathToFileURL(zodDir + "/index.js").href);

const todo = z.object({
  content: z.string().min(1),
  status: z.enum(["pending", "in_progress", "completed"]),
  activeForm: z.string().min(1),
});
const option = z.object({ label: z.string(), description: z.string() });
const question = z.object({
  question: z.string(),
  header: z.string().max(12),
  options: z.array(option).min(2).max(4),
  multiSelect: z.boolean(),
});
const cases = {
  "claude-code/Bash": z.strictObject({
    command: z.string(),
    timeout: z.number().max(600000).optional(),
    description: z.string().optional(),
    run_in_background: z.boolean().optional(),
    dangerouslyDisableSandbox: z.boolean().optional(),
  }),
  "claude-code/Edit": z.strictObject({
    file_path: z.string(), old_string: z.string(), new_string: z.string(),
    replace_all: z.boolean().default(false).optional(),
  }),
  "claude-code/Read": z.strictObject({
    file_path: z.string(), offset: z.number().int().nonnegative().optional(),
    limit: z.number().int().positive().optional(), pages: z.string().optional(), allow_large: z.boolean().optional(),
  }),
  "claude-code/Write": z.strictObject({ file_path: z.string(), content: z.string() }),
  "claude-code/Glob": z.strictObject({ pattern: z.string(), path: z.string().optional() }),
  "claude-code/Grep": z.strictObject({
    pattern: z.string(), path: z.string().optional(), glob: z.string().optional(),
    output_mode: z.enum(["content", "files_with_matches", "count"]).optional(),
    "-B": z.number().optional(), "-A": z.number().optional(), "-C": z.number().optional(),
    context: z.number().optional(), "-n": z.boolean().optional(), "-i": z.boolean().optional(),
    "-o": z.boolean().optional(), type: z.string().optional(), head_limit: z.number().optional(),
    offset: z.number().optional(), multiline: z.boolean().optional(),
  }),
  "claude-code/TodoWrite": z.strictObject({ todos: z.array(todo) }),
  "claude-code/WebFetch": z.strictObject({ url: z.url(), prompt: z.string(), offset: z.number().optional() }),
  "claude-code/WebSearch": z.strictObject({
    query: z.string().min(2), allowed_domains: z.array(z.string()).optional(),
    blocked_domains: z.array(z.string()).optional(),
  }),
  "claude-code/AskUserQuestion": z.strictObject({ questions: z.array(question).min(1).max(4) }),
  "zod/record": z.object({ scores: z.record(z.string(), z.number()) }),
  "zod/record-regex-keys": z.object({ env: z.record(z.string().regex(/^[A-Z_][A-Z0-9_]*$/), z.string()) }),
  "zod/record-enum-keys": z.object({ flags: z.record(z.enum(["a", "b", "c"]), z.boolean()) }),
  "zod/tuple": z.object({ point: z.tuple([z.number(), z.number()]), tagged: z.tuple([z.string(), z.int()], z.boolean()) }),
  "zod/multipleOf": z.object({ qty: z.int().multipleOf(5).min(0).max(100), step: z.number().multipleOf(3) }),
  "zod/two-regex": z.object({ code: z.string().regex(/^[A-Z]/).regex(/[0-9]$/) }),
  "zod/emoji": z.object({ mood: z.emoji() }),
  "zod/formats": z.object({
    email: z.email(), id: z.uuid(), at: z.iso.datetime(), day: z.iso.date(), time: z.iso.time(),
    ip: z.ipv4(), ip6: z.ipv6(), site: z.url(), cuid: z.cuid(), nano: z.nanoid(),
  }),
  "zod/discriminated-union": z.object({
    shape: z.discriminatedUnion("kind", [
      z.object({ kind: z.literal("circle"), r: z.number().positive() }),
      z.object({ kind: z.literal("rect"), w: z.number(), h: z.number() }),
    ]),
  }),
  "zod/union-nullable-optional": z.object({
    a: z.union([z.string(), z.number()]), b: z.string().nullable(), c: z.int().optional(),
    d: z.enum(["x", "y"]).default("x"), e: z.literal(42), f: z.array(z.string()).min(1).max(3),
  }),
  "zod/intersection": z.object({
    both: z.intersection(z.object({ a: z.string() }), z.object({ b: z.int() })),
  }),
  "zod/string-lengths": z.object({ s: z.string().min(2).max(8).startsWith("k").endsWith("3"), t: z.string().length(4) }),
  "zod/numbers": z.object({ n: z.number().gt(0).lt(1), i: z.int().gte(-5).lte(5), p: z.int().positive(), s: z.int32() }),
  "zod/recursive": (() => {
    const Node = z.object({ name: z.string(), get children() { return z.array(Node).optional(); } });
    return z.object({ tree: Node });
  })(),
};
const out = [];
for (const [name, schema] of Object.entries(cases)) out.push({ name, schema: z.toJSONSchema(schema) });
process.stdout.write(JSON.stringify(out, null, 1) + "\n");
