// Bundles src/main.jsx and its npm packages into one ES module (default dist/app.js; `node build.mjs OUT.js` to
// write elsewhere), with esbuild's JS API (it runs the same whether or not npm ran esbuild's install script).
import { realpathSync } from 'node:fs';
import { build } from 'esbuild';

// om-client comes from this repository (package.json: `file:../../clients/typescript`, built there first) until it is
// on npm. npm links it, so its imports would resolve from its own folder's node_modules: a second AI SDK in the page.
// They resolve from this page's node_modules first, as they would for a package installed from npm.
const omClient = realpathSync('node_modules/om-client');
const linkedPackageImports = {
  name: 'linked-package-imports',
  setup(bundler) {
    bundler.onResolve({ filter: /^[^./]/ }, async (args) => {
      if (args.pluginData?.fromPage || !args.importer.startsWith(`${omClient}/`)) return undefined;
      const options = { kind: args.kind, resolveDir: process.cwd(), pluginData: { fromPage: true } };
      const found = await bundler.resolve(args.path, options);
      return found.errors.length ? undefined : found;
    });
  },
};

await build({
  entryPoints: ['src/main.jsx'],
  bundle: true,
  format: 'esm',
  target: 'es2022',
  minify: true,
  outfile: process.argv[2] ?? 'dist/app.js',
  define: { 'process.env.NODE_ENV': '"production"' },
  plugins: [linkedPackageImports],
  logLevel: 'warning',
});
