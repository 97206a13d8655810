// End-to-end over HTTPS: the official OpenAI Node SDK talks to sluice with
// server.tls set, trusting the test's CA through NODE_EXTRA_CA_CERTS. The
// CA and the gateway's certificate are made with the openssl command when
// the test starts. Run with `node --test openai_sdk_tls.test.mjs`; the
// binaries come from SLUICE_BINARY and SLUICE_MOCK_BINARY.
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';

import { startMockAndGateway } from './harness.mjs';

const E2E_KEY = 'sk-e2e-tls-0123456789abcdef';
const here = dirname(fileURLToPath(import.meta.url));

// A CA, and a certificate it signed for localhost and 127.0.0.1.
function makeCertificates(dir) {
  const openssl = (...args) => execFileSync('openssl', args, { stdio: 'pipe' });
  const path = (name) => join(dir, name);
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  openssl('req', '-x509', ...ec, '-keyout', path('ca.key'), '-out', path('ca.crt'),
          '-subj', '/CN=sluice e2e CA', '-days', '1',
          '-addext', 'basicConstraints=critical,CA:TRUE',
          '-addext', 'keyUsage=critical,keyCertSign');
  openssl('req', ...ec, '-keyout', path('server.key'), '-out', path('server.csr'),
          '-subj', '/CN=localhost');
  writeFileSync(path('server.ext'), 'subjectAltName=DNS:localhost,IP:127.0.0.1\n');
  openssl('x509', '-req', '-in', path('server.csr'), '-CA', path('ca.crt'), '-CAkey',
          path('ca.key'), '-CAcreateserial', '-out', path('server.crt'), '-days', '1',
          '-extfile', path('server.ext'));
  return { ca: path('ca.crt'), cert: path('server.crt'), key: path('server.key') };
}

function gatewayConfig(files) {
  return (mockPort) => `server:
  listen: 127.0.0.1:0
  admin_listen: off
  threads: 2
  tls:
    cert: ${files.cert}
    key: ${files.key}

log:
  level: warn

auth:
  keys:
    - name: e2e
      key: ${E2E_KEY}

models:
  - name: e2e-chat
    deployments:
      - id: e2e-chat-mock
        base_url: http://127.0.0.1:${mockPort}/v1
        model: mock-model
`;
}

// Runs tls_sdk_client.mjs against `url` with `extraCa` trusted (none: only
// the system's CAs), and returns its exit status, output and errors.
function runClient(url, extraCa) {
  const env = { ...process.env };
  delete env.NODE_EXTRA_CA_CERTS;
  if (extraCa) env.NODE_EXTRA_CA_CERTS = extraCa;
  const result = spawnSync(process.execPath, [join(here, 'tls_sdk_client.mjs'), url, E2E_KEY],
                           { cwd: here, env, encoding: 'utf8', timeout: 30000 });
  return { status: result.status, stdout: result.stdout, stderr: result.stderr };
}

describe('OpenAI Node SDK over HTTPS', () => {
  let stack;
  let dir;
  let files;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'sluice-e2e-tls-'));
    files = makeCertificates(dir);
    stack = await startMockAndGateway(gatewayConfig(files));
  });

  after(async () => {
    await stack?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('the gateway announces an https URL', () => {
    assert.match(stack.gatewayUrl, /^https:\/\/127\.0\.0\.1:\d+$/);
  });

  test('completions and streams work with the test CA trusted', () => {
    const run = runClient(stack.gatewayUrl, files.ca);
    assert.equal(run.status, 0, run.stderr);
    const answer = JSON.parse(run.stdout.trim());
    assert.equal(answer.object, 'chat.completion');
    assert.ok(answer.content.length > 0, run.stdout);
    assert.ok(answer.chunks > 1, run.stdout);
    assert.ok(answer.streamed.length > 0, run.stdout);
  });

  test('without the CA the SDK refuses the certificate', () => {
    const run = runClient(stack.gatewayUrl, undefined);
    assert.notEqual(run.status, 0, run.stdout);
    assert.match(run.stderr, /Connection error|certificate|self.signed|issuer/i);
  });
});
