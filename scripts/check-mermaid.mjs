// Parses every ```mermaid block of the given Markdown files with mermaid 11 (what GitHub renders), under jsdom.
// scripts/docs-snippets.sh installs mermaid and jsdom from npm into its cache and runs a copy of this file from
// there, so that the bare imports resolve.
import fs from 'fs';
import { JSDOM } from 'jsdom';

const dom = new JSDOM('<!doctype html><html><body></body></html>');
globalThis.window = dom.window;
globalThis.document = dom.window.document;
const { default: mermaid } = await import('mermaid');
mermaid.initialize({ startOnLoad: false });

let failed = 0;
let seen = 0;
for (const file of process.argv.slice(2)) {
  const text = fs.readFileSync(file, 'utf8');
  const blocks = [...text.matchAll(/```mermaid\n([\s\S]*?)```/g)].map((m) => m[1]);
  for (const [i, block] of blocks.entries()) {
    seen++;
    try {
      await mermaid.parse(block);
      console.log(`ok     ${file}: diagram ${i + 1}`);
    } catch (e) {
      failed++;
      console.log(`FAILED ${file}: diagram ${i + 1}: ${e.message}`);
    }
  }
}
console.log(`${seen - failed} passed, ${failed} failed`);
process.exit(failed || !seen ? 1 : 0);
