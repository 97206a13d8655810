// What the end-to-end tests share: starting sluice-mock and sluice on
// ephemeral ports (each prints the port it took), writing the gateway's
// config, and stopping both. The binaries come from SLUICE_BINARY and
// SLUICE_MOCK_BINARY (tests/e2e/CMakeLists.txt sets them).
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const STARTUP_TIMEOUT_MS = 10000;
export const STOP_TIMEOUT_MS = 3000;

export function requireEnv(name) {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set: point it at the built binary (see tests/e2e/CMakeLists.txt)`);
  }
  return value;
}

const children = new Set();
// Last resort if the runner exits without reaching the after hook.
process.on('exit', () => {
  for (const child of children) child.kill('SIGKILL');
});

// Spawns `binary args...` and resolves with { child, scheme, port } once
// stdout carries "<banner> listening on http(s)://HOST:PORT". Rejects on
// early exit or timeout.
export function startProcess(binary, args, banner) {
  return new Promise((resolve, reject) => {
    const child = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    children.add(child);
    child.once('exit', () => children.delete(child));
    const pattern = new RegExp(`^${banner} listening on (https?)://(.+):(\\d+)\\s*$`, 'm');
    let stdout = '';
    let stderr = '';
    let settled = false;

    const finish = (error, value) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (error) {
        child.kill('SIGKILL');
        reject(error);
      } else {
        resolve(value);
      }
    };
    const timer = setTimeout(() => {
      finish(new Error(`${banner} did not report its port within ${STARTUP_TIMEOUT_MS} ms\n` +
                       `stdout: ${stdout}\nstderr: ${stderr}`));
    }, STARTUP_TIMEOUT_MS);

    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (chunk) => {
      stdout += chunk;
      const match = pattern.exec(stdout);
      if (match) finish(null, { child, scheme: match[1], port: Number(match[3]) });
    });
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (chunk) => {
      // Keep only the tail: enough to explain a failure, bounded in memory.
      stderr = (stderr + chunk).slice(-8192);
    });
    child.on('error', (error) => finish(new Error(`cannot start ${binary}: ${error.message}`)));
    child.on('exit', (code, signal) => {
      finish(new Error(`${banner} exited early (code ${code}, signal ${signal})\n` +
                       `stdout: ${stdout}\nstderr: ${stderr}`));
    });
  });
}

// SIGTERM, then SIGKILL if the process is still there after a grace period.
export function stopProcess(child) {
  if (!child || child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill('SIGKILL'), STOP_TIMEOUT_MS);
    child.once('exit', () => {
      clearTimeout(timer);
      resolve();
    });
    child.kill('SIGTERM');
  });
}

// The mock's default arguments: a short, quick answer of 8 tokens.
export const MOCK_ARGS = ['--listen', '127.0.0.1:0', '--ttft', '20ms', '--interval', '10ms',
                          '--tokens', '8'];

// Starts sluice-mock, then sluice with the config `gatewayConfig(mockPort)`
// returns (YAML text), written to a temporary directory. gatewayUrl is
// https:// when that config sets server.tls. Resolves with
// { mock, gateway, gatewayUrl, stop }: stop() ends both and removes the
// directory. A start that fails stops what it started before it rejects.
export async function startMockAndGateway(gatewayConfig, mockArgs = MOCK_ARGS) {
  const sluiceBinary = requireEnv('SLUICE_BINARY');
  const mockBinary = requireEnv('SLUICE_MOCK_BINARY');
  const stack = {
    mock: undefined,
    gateway: undefined,
    workDir: undefined,
    gatewayUrl: undefined,
    async stop() {
      await Promise.all([stopProcess(stack.gateway?.child), stopProcess(stack.mock?.child)]);
      if (stack.workDir) rmSync(stack.workDir, { recursive: true, force: true });
      stack.workDir = undefined;
    },
  };
  try {
    stack.mock = await startProcess(mockBinary, mockArgs, 'sluice-mock');
    stack.workDir = mkdtempSync(join(tmpdir(), 'sluice-e2e-'));
    const configPath = join(stack.workDir, 'sluice.yaml');
    writeFileSync(configPath, gatewayConfig(stack.mock.port));
    stack.gateway = await startProcess(sluiceBinary, ['--config', configPath], 'sluice');
    stack.gatewayUrl = `${stack.gateway.scheme}://127.0.0.1:${stack.gateway.port}`;
  } catch (error) {
    await stack.stop();
    throw error;
  }
  return stack;
}

// The object a sluice-mock tool call's arguments (and tool_use input) hold,
// whichever protocol it answers in (tools/mock/anthropic.cpp).
export const MOCK_TOOL_INPUT = {
  location: 'San Francisco, CA',
  unit: 'celsius',
  days: 3,
  note: 'say "hi"',
  tags: ['tok0', 'tok1'],
};
