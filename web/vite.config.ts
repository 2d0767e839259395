import { defineConfig } from "vite";
import { svelte, vitePreprocess } from "@sveltejs/vite-plugin-svelte";

// Served by `chunkfuse serve` at /ui/ (src/serve/knowledge_routes.cpp); no request leaves it.
export default defineConfig({
  base: "/ui/",
  plugins: [svelte({ preprocess: vitePreprocess() })],
  build: { outDir: "dist", emptyOutDir: true, chunkSizeWarningLimit: 600 },
  server: { proxy: { "/v1": "http://127.0.0.1:8080", "/metrics": "http://127.0.0.1:8080" } },
});
