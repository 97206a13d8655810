// The client side of openai_sdk_tls.test.mjs, run as a process of its own:
// NODE_EXTRA_CA_CERTS is read only when Node starts. Calls the gateway at
// argv[2] with the OpenAI SDK, a completion and a stream, and prints what
// came back as one JSON line.
import OpenAI from 'openai';

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${baseURL}/v1`, apiKey, maxRetries: 0, timeout: 10000 });

const completion = await client.chat.completions.create({
  model: 'e2e-chat',
  messages: [{ role: 'user', content: 'hi' }],
});
const stream = await client.chat.completions.create({
  model: 'e2e-chat',
  messages: [{ role: 'user', content: 'hi' }],
  stream: true,
});
let streamed = '';
let chunks = 0;
for await (const chunk of stream) {
  chunks += 1;
  streamed += chunk.choices[0]?.delta?.content ?? '';
}
process.stdout.write(JSON.stringify({
  content: completion.choices[0].message.content,
  object: completion.object,
  streamed,
  chunks,
}) + '\n');
