// The swiftlm playground: a chat over the public API only (/v1/models, /v1/chat/completions,
// DELETE /v1/sessions/{id}). Each chat is one session_id, so turn N+1 reuses turn N's KV; the
// whole conversation is sent every turn, as the OpenAI API expects.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORE = "swiftlm.apiKey";

const chat = { sessionId: newSessionId(), history: [], busy: false };

function newSessionId() {
  const random = window.crypto && crypto.randomUUID ? crypto.randomUUID() : String(Math.random()).slice(2);
  return "playground-" + random;
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function setStatus(text, isError) {
  $("status").textContent = text;
  $("status").classList.toggle("error", Boolean(isError));
}

async function errorText(response) {
  try {
    const body = await response.json();
    if (body && body.error && body.error.message) return `${response.status}: ${body.error.message}`;
  } catch (_) { /* not JSON */ }
  return `${response.status} ${response.statusText}`;
}

async function loadModels() {
  const select = $("model");
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    if (!response.ok) {
      setStatus(response.status === 401 ? "Enter the server's API key above." : await errorText(response), true);
      return;
    }
    const body = await response.json();
    select.replaceChildren(...body.data.map((card) => new Option(card.id, card.id)));
    setStatus(`Ready: ${body.data.length} model(s). Session ${chat.sessionId}.`);
  } catch (err) {
    setStatus("The server did not answer: " + err, true);
  }
}

function addMessage(role) {
  const box = document.createElement("div");
  box.className = "message " + role;
  const label = document.createElement("div");
  label.className = "role";
  label.textContent = role;
  box.append(label);
  const parts = { box, content: document.createElement("div") };
  parts.content.className = "content";
  if (role === "assistant") {
    parts.reasoning = document.createElement("details");
    parts.reasoning.className = "reasoning";
    parts.reasoning.hidden = true;
    const summary = document.createElement("summary");
    summary.textContent = "Reasoning";
    parts.reasoningText = document.createElement("div");
    parts.reasoningText.className = "text";
    parts.reasoning.append(summary, parts.reasoningText);
    box.append(parts.reasoning);
  }
  box.append(parts.content);
  $("messages").append(box);
  return parts;
}

function scrollDown() {
  const list = $("messages");
  list.scrollTop = list.scrollHeight;
}

// Server-sent events from a fetch body: yields each "data:" payload (a JSON chunk or [DONE]).
async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data:")) yield line.slice(5).trim();
      }
    }
  }
}

function showStats(parts, timing, usage) {
  const stats = document.createElement("div");
  stats.className = "stats";
  const ttft = timing.first === null ? null : timing.first - timing.start;
  const tokens = usage ? usage.completion_tokens : timing.chunks;
  const decodeS = timing.first === null ? 0 : (timing.end - timing.first) / 1000;
  const speed = tokens > 1 && decodeS > 0 ? (tokens - 1) / decodeS : null;
  const cached = usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens || 0 : 0;
  const items = [
    ["ttft", "TTFT " + (ttft === null ? "n/a" : ttft.toFixed(0) + " ms")],
    ["tps", (speed === null ? "n/a" : speed.toFixed(1)) + " tok/s"],
    ["tokens", tokens + " tokens"],
  ];
  if (usage) items.push(["cached", `prompt ${usage.prompt_tokens} (cached ${cached})`]);
  items.forEach(([cls, text], i) => {
    const span = document.createElement("span");
    span.className = cls;
    if (cls === "cached") span.dataset.value = String(cached);
    span.textContent = text;
    stats.append(...(i ? [" · ", span] : [span]));
  });
  parts.box.append(stats);
}

async function send(text) {
  chat.busy = true;
  $("send").disabled = true;
  const user = addMessage("user");
  user.content.textContent = text;
  chat.history.push({ role: "user", content: text });
  const parts = addMessage("assistant");
  parts.box.dataset.state = "streaming";
  scrollDown();
  const body = {
    model: $("model").value || undefined,
    messages: chat.history,
    stream: true,
    stream_options: { include_usage: true },
    session_id: chat.sessionId,
    chat_template_kwargs: { enable_thinking: $("thinking").checked },
  };
  const timing = { start: performance.now(), first: null, end: null, chunks: 0 };
  let usage = null;
  let answer = "";
  try {
    const response = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    if (!response.ok) throw new Error(await errorText(response));
    for await (const data of sseData(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] ? chunk.choices[0].delta || {} : {};
      const reasoning = delta.reasoning_content || delta.reasoning || "";
      if (reasoning || delta.content) {
        timing.first = timing.first === null ? performance.now() : timing.first;
        timing.chunks += 1;
      }
      if (reasoning) {
        parts.reasoning.hidden = false;
        parts.reasoningText.textContent += reasoning;
      }
      if (delta.content) {
        answer += delta.content;
        parts.content.textContent = answer;
      }
      scrollDown();
    }
    timing.end = performance.now();
    chat.history.push({ role: "assistant", content: answer });
    showStats(parts, timing, usage);
    parts.box.dataset.chunks = String(timing.chunks);  // how many deltas the answer arrived in
    parts.box.dataset.state = "done";
  } catch (err) {
    chat.history.pop();  // the question goes unanswered: leave it out of the next turn
    parts.box.classList.add("error");
    parts.content.textContent = String(err.message || err);
    parts.box.dataset.state = "error";
  } finally {
    chat.busy = false;
    $("send").disabled = false;
    scrollDown();
  }
}

async function newChat() {
  const old = chat.sessionId;
  chat.sessionId = newSessionId();
  chat.history = [];
  $("messages").replaceChildren();
  setStatus(`New chat: session ${chat.sessionId}.`);
  try {
    await fetch("/v1/sessions/" + encodeURIComponent(old), { method: "DELETE", headers: headers() });
  } catch (_) { /* the old session expires on its own */ }
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || chat.busy) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("new-chat").addEventListener("click", newChat);
$("api-key").addEventListener("change", () => {
  sessionStorage.setItem(KEY_STORE, $("api-key").value.trim());
  loadModels();
});
$("api-key").value = sessionStorage.getItem(KEY_STORE) || "";
loadModels();
