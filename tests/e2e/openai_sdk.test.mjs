// End-to-end: the official OpenAI Node SDK talks to sluice, which forwards to
// sluice-mock, as OpenAI's API and, through a `provider: anthropic`
// deployment, as Anthropic's Messages API. Run with
// `node --test openai_sdk.test.mjs`; the binaries come from SLUICE_BINARY and
// SLUICE_MOCK_BINARY.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import OpenAI, { toFile } from 'openai';

import { MOCK_TOOL_INPUT, startMockAndGateway } from './harness.mjs';

const E2E_KEY = 'sk-e2e-0123456789abcdef';

function gatewayConfig(mockPort) {
  const baseUrl = `http://127.0.0.1:${mockPort}/v1`;
  // Anthropic's base URL has no /v1: the adapter asks for /v1/messages.
  const anthropicUrl = `http://127.0.0.1:${mockPort}`;
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
  - name: e2e-chat
    deployments:
      - id: e2e-chat-mock
        base_url: ${baseUrl}
        model: mock-model

  - name: e2e-embed
    deployments:
      - id: e2e-embed-mock
        base_url: ${baseUrl}
        model: mock-model

  - name: e2e-org/chat
    deployments:
      - id: e2e-org-chat-mock
        base_url: ${baseUrl}
        model: mock-model

  - name: e2e-cached
    cache: {mode: exact}
    deployments:
      - id: e2e-cached-mock
        base_url: ${baseUrl}
        model: mock-model

  - name: e2e-media
    default_for: [/v1/moderations]
    deployments:
      - id: e2e-media-mock
        base_url: ${baseUrl}
        model: mock-media

  - name: e2e-claude
    deployments:
      - id: e2e-claude-mock
        base_url: ${anthropicUrl}
        provider: anthropic
        model: claude-mock

  # A model of its own for the overload test: its failures cool its
  # deployment down, which must not touch the other tests.
  - name: e2e-claude-overloaded
    deployments:
      - id: e2e-claude-overloaded-mock
        base_url: ${anthropicUrl}
        provider: anthropic
        model: claude-mock
`;
}

describe('OpenAI Node SDK through sluice', { timeout: 30000 }, () => {
  let stack;
  let client;

  before(async () => {
    stack = await startMockAndGateway(gatewayConfig);
    client = new OpenAI({
      baseURL: `${stack.gatewayUrl}/v1`,
      apiKey: E2E_KEY,
      maxRetries: 0,
      timeout: 10000,
    });
  });

  after(async () => {
    await stack?.stop();
  });

  const messages = [{ role: 'user', content: 'Say something.' }];
  let nonStreamText;

  test('chat.completions.create without streaming', async () => {
    const completion = await client.chat.completions.create({ model: 'e2e-chat', messages });
    assert.equal(completion.object, 'chat.completion');
    assert.equal(completion.model, 'mock-model');
    assert.ok(Array.isArray(completion.choices) && completion.choices.length === 1);
    const text = completion.choices[0].message.content;
    assert.equal(typeof text, 'string');
    assert.ok(text.length > 0, 'content is empty');
    assert.equal(completion.choices[0].finish_reason, 'stop');
    assert.ok(completion.usage, 'usage is missing');
    assert.ok(completion.usage.prompt_tokens >= 0);
    assert.ok(completion.usage.completion_tokens > 0);
    assert.equal(completion.usage.total_tokens,
                 completion.usage.prompt_tokens + completion.usage.completion_tokens);
    nonStreamText = text;
  });

  test('chat.completions.create with stream: true', async () => {
    const stream = await client.chat.completions.create({ model: 'e2e-chat', messages, stream: true });
    let contentDeltas = 0;
    let text = '';
    let finishReason = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      assert.equal(chunk.model, 'mock-model');
      for (const choice of chunk.choices) {
        const content = choice.delta?.content;
        if (typeof content === 'string' && content.length > 0) {
          contentDeltas += 1;
          text += content;
        }
        if (choice.finish_reason) finishReason = choice.finish_reason;
      }
    }
    assert.ok(contentDeltas >= 2, `expected at least 2 content deltas, got ${contentDeltas}`);
    assert.equal(finishReason, 'stop');
    // Both requests ask the same mock for the same number of tokens.
    if (nonStreamText === undefined) {
      const completion = await client.chat.completions.create({ model: 'e2e-chat', messages });
      nonStreamText = completion.choices[0].message.content;
    }
    assert.equal(text, nonStreamText);
  });

  test('embeddings.create', async () => {
    const response = await client.embeddings.create({ model: 'e2e-embed', input: 'hello world' });
    assert.equal(response.object, 'list');
    assert.equal(response.data.length, 1);
    const vector = response.data[0].embedding;
    assert.ok(Array.isArray(vector), 'embedding is not an array');
    assert.ok(vector.length > 0, 'embedding is empty');
    for (const value of vector) assert.ok(Number.isFinite(value), `not a number: ${value}`);
  });

  test('a cached answer is replayed as a stream the SDK reads', async () => {
    const request = { model: 'e2e-cached', messages, temperature: 0 };
    const { data: first, response: missed } =
      await client.chat.completions.create(request).withResponse();
    assert.equal(missed.headers.get('x-sluice-cache'), 'miss');
    const { data: stream, response: hit } = await client.chat.completions
      .create({ ...request, stream: true, stream_options: { include_usage: true } })
      .withResponse();
    assert.equal(hit.headers.get('x-sluice-cache'), 'hit');
    let text = '';
    let finishReason = null;
    let usage = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      for (const choice of chunk.choices) {
        if (typeof choice.delta?.content === 'string') text += choice.delta.content;
        if (choice.finish_reason) finishReason = choice.finish_reason;
      }
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(text, first.choices[0].message.content);
    assert.equal(finishReason, 'stop');
    assert.deepEqual(usage, first.usage);
  });

  test('audio.transcriptions.create uploads a file as multipart/form-data', async () => {
    const audio = Buffer.alloc(48 * 1024);
    for (let i = 0; i < audio.length; i++) audio[i] = (i * 131) & 0xff;
    const { data, response } = await client.audio.transcriptions
      .create({ file: await toFile(audio, 'speech.wav'), model: 'e2e-media', language: 'en' })
      .withResponse();
    assert.equal(response.headers.get('x-sluice-deployment'), 'e2e-media-mock');
    assert.match(data.text, /^tok0 tok1 /);
  });

  test('audio.speech.create returns the audio bytes', async () => {
    const response = await client.audio.speech.create({
      model: 'e2e-media', voice: 'alloy', input: 'Hello',
    });
    assert.equal(response.headers.get('content-type'), 'audio/mpeg');
    const audio = Buffer.from(await response.arrayBuffer());
    assert.equal(audio.length, 512);  // the mock's 64 bytes per token, 8 tokens
    assert.equal(audio.subarray(0, 3).toString('latin1'), 'ID3');
  });

  test('moderations.create, also without a model, and images.generate', async () => {
    const moderation = await client.moderations.create({ model: 'e2e-media', input: 'hello' });
    assert.equal(moderation.model, 'mock-media');
    assert.equal(moderation.results[0].flagged, false);
    const { data: defaulted, response } =
      await client.moderations.create({ input: 'hello' }).withResponse();
    assert.equal(response.headers.get('x-sluice-deployment'), 'e2e-media-mock');
    assert.equal(defaulted.model, 'mock-media');
    const image = await client.images.generate({ model: 'e2e-media', prompt: 'a lighthouse' });
    const bytes = Buffer.from(image.data[0].b64_json, 'base64');
    assert.equal(bytes.subarray(0, 3).toString('latin1'), 'ID3');
  });

  test('models.list', async () => {
    const ids = [];
    for await (const model of client.models.list()) ids.push(model.id);
    assert.ok(ids.includes('e2e-chat'), `e2e-chat missing from ${JSON.stringify(ids)}`);
    assert.ok(ids.includes('e2e-embed'), `e2e-embed missing from ${JSON.stringify(ids)}`);
  });

  test('models.retrieve, also of a name with a slash, and of a model that does not exist', async () => {
    for (const id of ['e2e-chat', 'e2e-org/chat']) {
      const model = await client.models.retrieve(id);
      assert.equal(model.id, id);
      assert.equal(model.object, 'model');
    }
    await assert.rejects(client.models.retrieve('no-such-model'), (error) => {
      assert.ok(error instanceof OpenAI.NotFoundError, `not a NotFoundError: ${error}`);
      assert.equal(error.code, 'model_not_found');
      return true;
    });
  });

  test('a wrong key is a 401 invalid_api_key', async () => {
    const intruder = new OpenAI({
      baseURL: client.baseURL,
      apiKey: 'sk-not-a-key-of-this-gateway',
      maxRetries: 0,
      timeout: 10000,
    });
    await assert.rejects(
      intruder.chat.completions.create({ model: 'e2e-chat', messages }),
      (error) => {
        assert.ok(error instanceof OpenAI.AuthenticationError, `not an AuthenticationError: ${error}`);
        assert.equal(error.status, 401);
        assert.equal(error.code, 'invalid_api_key');
        return true;
      });
  });

  test('unknown model is a 404 model_not_found', async () => {
    await assert.rejects(
      client.chat.completions.create({ model: 'no-such-model', messages }),
      (error) => {
        assert.ok(error instanceof OpenAI.APIError, `not an APIError: ${error}`);
        assert.ok(error instanceof OpenAI.NotFoundError, `not a NotFoundError: ${error}`);
        assert.equal(error.status, 404);
        assert.equal(error.code, 'model_not_found');
        return true;
      });
  });

  describe('to a provider: anthropic deployment (Anthropic Messages upstream)', () => {
    const question = [{ role: 'user', content: 'Say something, and say it at some length.' }];
    const tools = [{
      type: 'function',
      function: {
        name: 'get_forecast',
        description: 'The weather forecast for a place.',
        parameters: {
          type: 'object',
          properties: { location: { type: 'string' }, days: { type: 'integer' } },
          required: ['location'],
        },
      },
    }];
    let plainText;

    test('chat.completions.create: content, finish_reason and usage', async () => {
      const { data: completion, response } = await client.chat.completions
        .create({ model: 'e2e-claude', messages: question })
        .withResponse();
      assert.equal(response.headers.get('x-sluice-deployment'), 'e2e-claude-mock');
      assert.equal(completion.object, 'chat.completion');
      assert.equal(completion.model, 'claude-mock');
      assert.match(completion.id, /^msg_/);
      assert.equal(completion.choices.length, 1);
      const { message } = completion.choices[0];
      assert.equal(message.role, 'assistant');
      assert.equal(message.content, 'tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 ');
      assert.equal(message.tool_calls, undefined);
      assert.equal(completion.choices[0].finish_reason, 'stop');
      const { usage } = completion;
      assert.ok(usage.prompt_tokens > 0, `prompt_tokens ${usage.prompt_tokens}`);
      assert.equal(usage.completion_tokens, 8);
      assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
      plainText = message.content;
    });

    test('chat.completions.create streamed: content reassembled, a final usage chunk', async () => {
      const stream = await client.chat.completions.create({
        model: 'e2e-claude',
        messages: question,
        stream: true,
        stream_options: { include_usage: true },
      });
      let text = '';
      let contentChunks = 0;
      let finishReason = null;
      let usageChunks = 0;
      let last;
      for await (const chunk of stream) {
        assert.equal(chunk.object, 'chat.completion.chunk');
        for (const choice of chunk.choices) {
          if (typeof choice.delta?.content === 'string' && choice.delta.content.length > 0) {
            text += choice.delta.content;
            contentChunks += 1;
          }
          if (choice.finish_reason) finishReason = choice.finish_reason;
        }
        if (chunk.usage) usageChunks += 1;
        last = chunk;
      }
      assert.ok(contentChunks >= 2, `expected several content chunks, got ${contentChunks}`);
      assert.equal(text, plainText ?? 'tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 ');
      assert.equal(finishReason, 'stop');
      // The usage comes once, last, in a chunk without choices.
      assert.equal(usageChunks, 1);
      assert.deepEqual(last.choices, []);
      assert.ok(last.usage.prompt_tokens > 0);
      assert.equal(last.usage.completion_tokens, 8);
      assert.equal(last.usage.total_tokens, last.usage.prompt_tokens + last.usage.completion_tokens);
    });

    test('tool calls streamed: the SDK reassembles the arguments', async () => {
      const stream = client.chat.completions.stream(
        { model: 'e2e-claude', messages: question, tools, stream_options: { include_usage: true } },
        { headers: { 'x-mock-anthropic': 'tools' } });
      let argumentChunks = 0;
      let toolCallId;
      for await (const chunk of stream) {
        for (const call of chunk.choices[0]?.delta?.tool_calls ?? []) {
          if (call.id) toolCallId = call.id;
          if (call.function?.arguments) argumentChunks += 1;
        }
      }
      const completion = await stream.finalChatCompletion();
      assert.ok(argumentChunks > 5, `the arguments came in ${argumentChunks} chunks`);
      const choice = completion.choices[0];
      assert.equal(choice.finish_reason, 'tool_calls');
      // The mock answers text before its tool_use block.
      assert.equal(choice.message.content, 'tok0 tok1 tok2 tok3 tok4 tok5 tok6 tok7 ');
      assert.equal(choice.message.tool_calls.length, 1);
      const [call] = choice.message.tool_calls;
      assert.equal(call.type, 'function');
      assert.equal(call.function.name, 'get_forecast');
      // Anthropic's tool_use id, kept.
      assert.match(call.id, /^toolu_/);
      assert.equal(call.id, toolCallId);
      assert.deepEqual(JSON.parse(call.function.arguments), MOCK_TOOL_INPUT);
      assert.ok(completion.usage.completion_tokens > 0);
    });

    test('tool calls without streaming', async () => {
      const completion = await client.chat.completions.create(
        { model: 'e2e-claude', messages: question, tools },
        { headers: { 'x-mock-anthropic': 'tools' } });
      const choice = completion.choices[0];
      assert.equal(choice.finish_reason, 'tool_calls');
      const [call] = choice.message.tool_calls;
      assert.match(call.id, /^toolu_/);
      assert.equal(call.function.name, 'get_forecast');
      assert.deepEqual(JSON.parse(call.function.arguments), MOCK_TOOL_INPUT);
    });

    test('an overloaded upstream (529) is an OpenAI-shaped APIError once retries are spent',
         async () => {
           const started = Date.now();
           await assert.rejects(
             client.chat.completions.create(
               { model: 'e2e-claude-overloaded', messages: question },
               { headers: { 'x-mock-fail': 'overloaded' } }),
             (error) => {
               assert.ok(error instanceof OpenAI.APIError, `not an APIError: ${error}`);
               assert.ok(error instanceof OpenAI.InternalServerError,
                         `not an InternalServerError: ${error}`);
               // The last upstream answer, its status kept and its body in
               // OpenAI's shape (router.retries: 2 by default, so 3 attempts).
               assert.equal(error.status, 529);
               assert.equal(error.type, 'server_error');
               assert.equal(error.code, 'overloaded');
               assert.equal(error.error.message, 'Overloaded');
               assert.equal(error.headers.get('x-sluice-attempts'), '3');
               assert.equal(error.headers.get('x-sluice-deployment'), 'e2e-claude-overloaded-mock');
               return true;
             });
           assert.ok(Date.now() - started < 10000);
         });
  });
});
