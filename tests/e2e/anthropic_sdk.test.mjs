// End-to-end: the official Anthropic Node SDK talks to sluice's /v1/messages,
// which forwards to sluice-mock: as it is to a `provider: anthropic`
// deployment (the mock's /v1/messages), and translated to chat completions
// for an openai deployment (the mock's /v1/chat/completions). Run with
// `node --test anthropic_sdk.test.mjs`; the binaries come from SLUICE_BINARY
// and SLUICE_MOCK_BINARY.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';

import { MOCK_TOOL_INPUT, startMockAndGateway } from './harness.mjs';

const E2E_KEY = 'sk-e2e-anthropic-0123456789abcdef';
const MOCK_TEXT = 'tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 ';

function gatewayConfig(mockPort) {
  return `server:
  listen: 127.0.0.1:0
  admin_listen: off
  threads: 2

log:
  level: warn

auth:
  keys:
    - name: e2e
      key: ${E2E_KEY}

models:
  - name: e2e-claude
    deployments:
      - id: e2e-claude-mock
        base_url: http://127.0.0.1:${mockPort}
        provider: anthropic
        model: claude-mock

  - name: e2e-gpt
    deployments:
      - id: e2e-gpt-mock
        base_url: http://127.0.0.1:${mockPort}/v1
        model: gpt-mock
`;
}

// The tool each request offers; the mock calls the first one offered.
const tools = [{
  name: 'get_forecast',
  description: 'The weather forecast for a place.',
  input_schema: {
    type: 'object',
    properties: { location: { type: 'string' }, days: { type: 'integer' } },
    required: ['location'],
  },
}];
// Long enough that the mock counts several prompt tokens (characters / 4).
const messages = [{ role: 'user', content: 'Say something, and say it at some length.' }];

// The two ways to an upstream: Anthropic's Messages API passed through, and
// an OpenAI upstream the gateway translates to and from.
const routes = [
  {
    title: 'to a provider: anthropic deployment (passed through)',
    model: 'e2e-claude',
    deployment: 'e2e-claude-mock',
    // The answer passes through: it names the deployment's model.
    upstreamModel: 'claude-mock',
    toolHeaders: { 'x-mock-anthropic': 'tools' },
    // The mock's input_json_delta events, relayed as they are.
    minInputPieces: 6,
  },
  {
    title: 'to an openai deployment (translated to chat completions)',
    model: 'e2e-gpt',
    deployment: 'e2e-gpt-mock',
    toolHeaders: { 'x-mock-openai': 'tools' },
    // However the gateway groups the mock's argument chunks into events.
    minInputPieces: 1,
  },
];

function textOf(message) {
  return message.content.filter((block) => block.type === 'text').map((block) => block.text).join('');
}

function assertUsage(usage) {
  assert.ok(usage, 'usage is missing');
  assert.ok(usage.input_tokens > 0, `input_tokens ${usage.input_tokens}`);
  assert.ok(usage.output_tokens > 0, `output_tokens ${usage.output_tokens}`);
}

function assertToolUse(message) {
  assert.equal(message.type, 'message');
  assert.equal(message.role, 'assistant');
  assert.equal(message.stop_reason, 'tool_use');
  const toolUses = message.content.filter((block) => block.type === 'tool_use');
  assert.equal(toolUses.length, 1, `content: ${JSON.stringify(message.content)}`);
  const [toolUse] = toolUses;
  assert.equal(typeof toolUse.id, 'string');
  assert.ok(toolUse.id.length > 0, 'the tool_use block has no id');
  assert.equal(toolUse.name, 'get_forecast');
  assert.deepEqual(toolUse.input, MOCK_TOOL_INPUT);
  assertUsage(message.usage);
}

describe('Anthropic Node SDK through sluice', { timeout: 30000 }, () => {
  let stack;
  let client;

  before(async () => {
    stack = await startMockAndGateway(gatewayConfig);
    client = new Anthropic({
      baseURL: stack.gatewayUrl,
      apiKey: E2E_KEY,
      maxRetries: 0,
      timeout: 10000,
    });
  });

  after(async () => {
    await stack?.stop();
  });

  for (const route of routes) {
    describe(route.title, () => {
      test('messages.create: text, stop_reason end_turn, usage', async () => {
        const { data: message, response } = await client.messages
          .create({ model: route.model, max_tokens: 256, messages })
          .withResponse();
        assert.equal(response.headers.get('x-sluice-deployment'), route.deployment);
        assert.equal(message.type, 'message');
        assert.equal(message.role, 'assistant');
        if (route.upstreamModel) {
          assert.equal(message.model, route.upstreamModel);
        } else {
          assert.equal(typeof message.model, 'string');
          assert.ok(message.model.length > 0, 'the message names no model');
        }
        assert.equal(textOf(message), MOCK_TEXT);
        assert.equal(message.stop_reason, 'end_turn');
        assertUsage(message.usage);
      });

      test('messages.stream: the text the events carried is the final message', async () => {
        const stream = client.messages.stream({ model: route.model, max_tokens: 256, messages });
        let streamed = '';
        let textDeltas = 0;
        const eventTypes = [];
        for await (const event of stream) {
          eventTypes.push(event.type);
          if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') {
            streamed += event.delta.text;
            textDeltas += 1;
          }
        }
        const message = await stream.finalMessage();
        assert.ok(textDeltas >= 2, `expected several text deltas, got ${textDeltas}`);
        assert.equal(streamed, MOCK_TEXT);
        assert.equal(textOf(message), streamed);
        assert.equal(message.stop_reason, 'end_turn');
        assertUsage(message.usage);
        assert.equal(eventTypes[0], 'message_start');
        assert.equal(eventTypes.at(-1), 'message_stop');
        assert.ok(eventTypes.includes('message_delta'), `events: ${eventTypes.join(' ')}`);
      });

      test('tool use with messages.create', async () => {
        const message = await client.messages.create(
          { model: route.model, max_tokens: 256, messages, tools },
          { headers: route.toolHeaders });
        assertToolUse(message);
      });

      test('tool use with messages.stream and finalMessage', async () => {
        const stream = client.messages.stream(
          { model: route.model, max_tokens: 256, messages, tools },
          { headers: route.toolHeaders });
        let inputPieces = 0;
        let partialJson = '';
        for await (const event of stream) {
          if (event.type === 'content_block_delta' && event.delta.type === 'input_json_delta') {
            inputPieces += 1;
            partialJson += event.delta.partial_json;
          }
        }
        const message = await stream.finalMessage();
        assert.ok(inputPieces >= route.minInputPieces, `the input came in ${inputPieces} pieces`);
        assert.deepEqual(JSON.parse(partialJson), MOCK_TOOL_INPUT);
        assertToolUse(message);
      });
    });
  }

  test('the key may come as Authorization: Bearer', async () => {
    const bearer = new Anthropic({
      baseURL: stack.gatewayUrl,
      authToken: E2E_KEY,
      maxRetries: 0,
      timeout: 10000,
    });
    const message = await bearer.messages.create({ model: 'e2e-claude', max_tokens: 64, messages });
    assert.equal(textOf(message), MOCK_TEXT);
  });

  test('an anthropic-beta header is accepted on the way to an anthropic deployment', async () => {
    const message = await client.messages.create(
      { model: 'e2e-claude', max_tokens: 64, messages },
      { headers: { 'anthropic-beta': 'prompt-caching-2024-07-31' } });
    assert.equal(message.stop_reason, 'end_turn');
    assert.equal(textOf(message), MOCK_TEXT);
  });

  test('a wrong key is an AuthenticationError in Anthropic\'s error shape', async () => {
    const intruder = new Anthropic({
      baseURL: stack.gatewayUrl,
      apiKey: 'sk-not-a-key-of-this-gateway',
      maxRetries: 0,
      timeout: 10000,
    });
    await assert.rejects(
      intruder.messages.create({ model: 'e2e-claude', max_tokens: 64, messages }),
      (error) => {
        assert.ok(error instanceof Anthropic.AuthenticationError,
                  `not an AuthenticationError: ${error}`);
        assert.equal(error.status, 401);
        assert.equal(error.error?.type, 'error', `body: ${JSON.stringify(error.error)}`);
        assert.equal(error.error.error?.type, 'authentication_error');
        assert.equal(typeof error.error.error.message, 'string');
        assert.ok(error.error.error.message.length > 0);
        return true;
      });
  });
});
