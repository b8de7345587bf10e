// Validates an OpenAPI document (a file path, or `-` for standard input) with
// @seriousme/openapi-schema-validator, against the OpenAPI 3.1 JSON Schema; exits 1
// with the errors when it is not valid.
import { readFileSync } from "node:fs";
import { Validator } from "@seriousme/openapi-schema-validator";

const path = process.argv[2];
const doc = JSON.parse(readFileSync(path === "-" ? 0 : path, "utf8"));
const validator = new Validator();
const result = await validator.validate(doc);
if (!result.valid) {
  console.error(JSON.stringify(result.errors, null, 2));
  process.exit(1);
}
console.log(`valid OpenAPI ${validator.version}`);
