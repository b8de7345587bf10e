// Checks events against the service's /schema/events.json with Ajv (JSON Schema
// 2020-12, strict): stdin is {"schema", "valid": [...], "invalid": [...]}. Exits 1
// naming every valid event refused and every invalid one accepted.
import { readFileSync } from "node:fs";
import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

const { schema, valid, invalid } = JSON.parse(readFileSync(0, "utf8"));
const ajv = new Ajv2020({ strict: false, allErrors: true });
addFormats(ajv);
const check = ajv.compile(schema);
let failed = 0;
for (const e of valid) {
  if (!check(e)) {
    failed++;
    console.error(`refused ${e.type}: ${ajv.errorsText(check.errors)}`);
  }
}
for (const e of invalid) {
  if (check(e)) {
    failed++;
    console.error(`accepted an invalid ${e.type}: ${JSON.stringify(e.payload)}`);
  }
}
console.log(`${valid.length} valid and ${invalid.length} invalid events checked`);
process.exit(failed ? 1 : 0);
