// The page's only way out: same-origin calls to `chunkfuse serve` (README "API").
// The API key, when the server wants one, lives in sessionStorage (gone with the tab).

const KEY_NAME = "chunkfuse.apiKey";

export function apiKey(): string {
  return sessionStorage.getItem(KEY_NAME) ?? "";
}
export function setApiKey(k: string): void {
  if (k) sessionStorage.setItem(KEY_NAME, k);
  else sessionStorage.removeItem(KEY_NAME);
}

export class ApiError extends Error {
  constructor(public status: number, message: string) {
    super(message);
  }
}

function headers(json: boolean): HeadersInit {
  const h: Record<string, string> = {};
  if (json) h["Content-Type"] = "application/json";
  const k = apiKey();
  if (k) h["Authorization"] = `Bearer ${k}`;
  return h;
}

async function errorOf(res: Response): Promise<ApiError> {
  let msg = `HTTP ${res.status}`;
  try {
    const body = await res.json();
    if (body?.error?.message) msg = body.error.message;
  } catch {
    /* not JSON */
  }
  if (res.status === 401) msg += " (enter the server's API key above)";
  return new ApiError(res.status, msg);
}

export async function call<T>(method: string, path: string, body?: unknown): Promise<T> {
  const res = await fetch(path, {
    method,
    headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!res.ok) throw await errorOf(res);
  return (await res.json()) as T;
}

export async function text(path: string): Promise<string> {
  const res = await fetch(path, { headers: headers(false) });
  if (!res.ok) throw await errorOf(res);
  return res.text();
}

export interface Progress {
  done: number;
  total: number;
  failed: number;
}
export interface DocumentInfo {
  id: string;
  name: string;
  format: string;
  bytes: number;
  n_chunks: number;
  n_tokens: number;
  chunk_tokens: number;
  status: "precomputing" | "ready" | "failed";
  progress: Progress;
}
export interface CacheState {
  memory: boolean;
  disk: boolean;
  remote: boolean | null; // null: no remote tier (or Redis did not answer)
  variants: number; // Cache-Craft variants of the chunk
  anchors: boolean; // QCFuse anchors stored with it
}
export interface ChunkInfo {
  id: string;
  document_id: string;
  source: string;
  index: number;
  n_tokens: number;
  summary: string;
  hash: string;
  cache_id: string;
  state: string;
  cache: "disk" | "memory" | "none";
  cache_state: CacheState | null; // null until precomputed
  uses: number;
  error?: string;
}
export interface Retrieved {
  chunk_id: string;
  document_id: string;
  source: string;
  cache_id: string;
  score: number;
  n_tokens: number;
}
export interface Timings {
  queue_ms: number;
  lookup_ms: number;
  load_ms: number;
  selection_ms: number;
  recompute_ms: number;
  ttft_ms: number;
  decode_ms: number;
}
export interface DetailChunk {
  cache_id: string;
  chunk_id?: string;
  source?: string;
  score?: number;
  begin: number;
  exact: boolean;
  tokens: string[];
  recomputed: number[];
  last_layer: number; // the last layer recomputing its rows (Cache-Craft stops unfocused chunks early)
  scores?: number[];
}
// What the auto policy chose (chunkfuse.auto).
export interface AutoChoice {
  method: string;
  ratio: number;
  predicted_quality: number;
  decision_ms: number;
  steps_run: number;
  calibrated: boolean;
}
export interface Detail {
  id: string;
  method: string;
  ratio: number;
  auto?: AutoChoice;
  answer: string;
  n_layers: number;
  chunks: DetailChunk[];
  context_tokens: number;
  recomputed_tokens: number;
  recomputed_share: number;
  retrieval: Retrieved[];
  selection: Record<string, unknown>;
  score_kind: string; // what the selector's per-token scores are, or "none: ..." and why
  timings: Timings;
  usage: Record<string, unknown>;
}

// The file as base64 by the browser's own encoder (a data: URL), fast for large files.
function base64Of(file: File): Promise<string> {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(String(r.result).slice(String(r.result).indexOf(",") + 1));
    r.onerror = () => reject(new Error(`cannot read ${file.name}`));
    r.readAsDataURL(file);
  });
}

export async function uploadFile(file: File, chunkTokens: number): Promise<DocumentInfo> {
  return call<DocumentInfo>("POST", "/v1/documents", {
    name: file.name,
    content_base64: await base64Of(file),
    chunk_tokens: chunkTokens,
  });
}

export interface ChatMessage {
  role: "system" | "user" | "assistant";
  content: string;
}
export interface ChatOptions {
  model: string;
  method: string;
  ratio: number;
  quality: number; // method "auto": the share of answers identical to full prefill's
  serverDefault: boolean; // method, ratio and quality are the server's: send none of them
  reorder: boolean;
  k: number;
  maxTokens: number;
}

// Streams one chat answer (server-sent events); returns the response id for /v1/details.
export async function streamChat(
  messages: ChatMessage[],
  o: ChatOptions,
  onText: (t: string) => void,
  signal?: AbortSignal,
): Promise<string> {
  const res = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers(true),
    signal,
    body: JSON.stringify({
      model: o.model,
      messages,
      stream: true,
      max_tokens: o.maxTokens,
      temperature: 0,
      retrieval: { k: o.k },
      // "auto" picks the ratio itself from the quality asked for (a ratio with it is a 400).
      // Left at the server's defaults, the request names none, so the server's whole policy
      // applies (its --ttft-ms too) as it does for any client that sends no fusion fields.
      fusion: o.serverDefault
        ? { reorder: o.reorder }
        : o.method === "auto"
          ? { method: o.method, quality: o.quality, reorder: o.reorder }
          : { method: o.method, ratio: o.ratio, reorder: o.reorder },
    }),
  });
  if (!res.ok || !res.body) throw await errorOf(res);
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  let id = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let sep: number;
    while ((sep = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, sep);
      buf = buf.slice(sep + 2);
      if (!event.startsWith("data: ")) continue;
      const data = event.slice(6);
      if (data === "[DONE]") return id;
      const j = JSON.parse(data);
      if (j.error) throw new ApiError(j.error.code ?? 500, j.error.message);
      if (j.id) id = j.id;
      const piece = j.choices?.[0]?.delta?.content;
      if (piece) onText(piece);
    }
  }
  return id;
}

// Prometheus text -> {name{labels}: value}.
export function parseMetrics(t: string): Map<string, number> {
  const m = new Map<string, number>();
  for (const line of t.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const sp = line.lastIndexOf(" ");
    m.set(line.slice(0, sp), Number(line.slice(sp + 1)));
  }
  return m;
}

// One fusion method as GET /v1/methods describes it (the server's selector registry): what
// fusion.method accepts, and the fusion.options each method takes.
export interface MethodParam {
  name: string;
  type: "number" | "integer" | "boolean" | "string" | "layers";
  default: unknown;
  values?: string[];
  help: string;
}
export interface MethodInfo {
  id: string;
  parameters: MethodParam[];
  fields?: MethodParam[]; // fusion fields besides the options ("auto": quality)
}
// The server's fusion for requests that name none (serve --method, --ratio, --quality, --ttft-ms).
export interface FusionDefaults {
  method: string;
  ratio: number;
  quality?: number;
  ttft_ms?: number;
  fusion_method?: string; // where the page starts when the server's default is full prefill
}
export interface MethodList {
  default: string;
  defaults?: FusionDefaults;
  data: MethodInfo[];
}

export async function loadMethods(): Promise<MethodList> {
  return call<MethodList>("GET", "/v1/methods");
}

// "probe_rows: question | suffix (default question)", one per parameter.
export function describeParam(p: MethodParam): string {
  const kinds = p.values?.length ? p.values.join(" | ") : p.type;
  const dflt = p.default === null || p.default === undefined ? "" : ` (default ${JSON.stringify(p.default)})`;
  return `${p.name}: ${kinds}${dflt} - ${p.help}`;
}
