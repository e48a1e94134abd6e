// Bundles src/main.jsx and its npm packages into one ES module (default dist/app.js; `node build.mjs OUT.js` to
// write elsewhere), with esbuild's JS API (it runs the same whether or not npm ran esbuild's install script).
import { build } from 'esbuild';

await build({
  entryPoints: ['src/main.jsx'],
  bundle: true,
  format: 'esm',
  target: 'es2022',
  minify: true,
  outfile: process.argv[2] ?? 'dist/app.js',
  define: { 'process.env.NODE_ENV': '"production"' },
  logLevel: 'warning',
});
