// What every protocol script shares: its scenario (JSON, on stdin), the
// warnings the stock clients print (a client that strips or drops what parley sent says
// so on the console: a test fails on any), and the one JSON line it answers with.
import { existsSync, readFileSync, writeFileSync } from "node:fs";

export const scenario = JSON.parse(readFileSync(0, "utf8"));

export const warnings = [];
for (const level of ["warn", "error"]) {
  const original = console[level];
  console[level] = (...args) => {
    warnings.push(args.map((a) => (a instanceof Error ? a.message : String(a))).join(" "));
    original.apply(console, args);
  };
}

// Ask the test (the Python side) to act, and wait until it has: the script writes
// `<name>.asked` in the scenario's rendezvous directory and waits for `<name>.done`.
export async function ask(name, timeoutMs = 30000) {
  const dir = scenario.rendezvous;
  writeFileSync(`${dir}/${name}.asked`, "");
  const deadline = Date.now() + timeoutMs;
  while (!existsSync(`${dir}/${name}.done`)) {
    if (Date.now() > deadline) throw new Error(`the test never answered ${name}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export function errorOf(error) {
  if (error == null) return null;
  return { message: String(error.message ?? error), status: error.status ?? null, payload: error.payload ?? null };
}

export function answer(result) {
  process.stdout.write(`${JSON.stringify({ ...result, warnings })}\n`);
}
