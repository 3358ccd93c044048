// A forced tool call through the AI SDK, whole and streamed, against omlx at argv[2];
// prints what the SDK hands its user, as JSON, for the Python test to check.
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, streamText, tool } from "ai";
import { z } from "zod";

const [baseURL, modelId] = process.argv.slice(2);
const omlx = createOpenAICompatible({ name: "omlx", baseURL, apiKey: "x", supportsStructuredOutputs: true });
const model = omlx.chatModel(modelId);
const tools = {
  get_weather: tool({
    description: "The weather in a city",
    inputSchema: z.object({ city: z.string().max(20) }),
  }),
};
const ask = { model, tools, toolChoice: "required", maxOutputTokens: 60, temperature: 0,
  prompt: "What is the weather in Paris? Call get_weather." };

const whole = await generateText(ask);
const parts = [];
const streamed = streamText(ask);
for await (const part of streamed.fullStream) {
  if (part.type.startsWith("tool-")) parts.push({ type: part.type, toolName: part.toolName, delta: part.delta });
}
console.log(JSON.stringify({
  calls: whole.toolCalls.map((c) => ({ name: c.toolName, input: c.input })),
  finishReason: whole.finishReason,
  parts,
}));
