// slotserve interop: a Node.js client ("an SDK in another language") built at run time from the repository's
// proto/ with @grpc/proto-loader and @grpc/grpc-js.
//
//   node client.js HOST:PORT
//
// Calls ServerLive, ModelMetadata, ModelInfer on `simple` (raw little-endian INT32 inputs), an unknown model,
// ModelStreamInfer (successes around one failing request on the same stream, then a clean end), and the
// management service's RegisterModel (reconfiguring `simple` to one slot) and ListModels (the server must run with --allow-management).
// Asserts what it checks (exit code 1 and a message on stderr otherwise) and prints one JSON object as its last
// line, which tests/interop/test_node.py checks again.
'use strict';

const assert = require('node:assert/strict');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_DIR = path.resolve(__dirname, '..', '..', '..', 'proto');
const LOADER_OPTIONS = {keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true,
                        includeDirs: [PROTO_DIR]};
const DEADLINE_MS = 30000;

function load(file) {
  return grpc.loadPackageDefinition(protoLoader.loadSync(path.join(PROTO_DIR, file), LOADER_OPTIONS));
}

function deadline() {
  return new Date(Date.now() + DEADLINE_MS);
}

function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    client[method](request, {deadline: deadline()}, (error, response) => (error ? reject(error) : resolve(response)));
  });
}

// A small deterministic generator (no dependency), so a failing run can be repeated exactly.
function makeRandom(seed) {
  let state = seed >>> 0;
  return () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0;
    return state;
  };
}
const random = makeRandom(20261101);

function randomInt32s(count) {
  // Values in [-500000, 500000), so that sums and differences stay far from INT32 overflow.
  return Array.from({length: count}, () => (random() % 1000000) - 500000);
}

function int32Buffer(values) {
  const buffer = Buffer.alloc(values.length * 4);
  values.forEach((value, index) => buffer.writeInt32LE(value, index * 4));
  return buffer;
}

function readInt32s(buffer) {
  const values = [];
  for (let offset = 0; offset < buffer.length; offset += 4) values.push(buffer.readInt32LE(offset));
  return values;
}

function simpleRequest(id, batch, datatype = 'INT32') {
  const a = randomInt32s(batch * 16);
  const b = randomInt32s(batch * 16);
  const encode = datatype === 'INT32' ? int32Buffer : (values) => {
    const buffer = Buffer.alloc(values.length * 4);
    values.forEach((value, index) => buffer.writeFloatLE(value, index * 4));
    return buffer;
  };
  const request = {
    model_name: 'simple',
    id,
    inputs: [
      {name: 'INPUT0', datatype, shape: [batch, 16]},
      {name: 'INPUT1', datatype, shape: [batch, 16]},
    ],
    raw_input_contents: [encode(a), encode(b)],
  };
  return {request, a, b};
}

function checkSimpleResponse(response, sent, batch) {
  assert.equal(response.model_name, 'simple');
  assert.equal(response.id, sent.request.id);
  assert.deepEqual(response.outputs.map((o) => o.name), ['OUTPUT0', 'OUTPUT1']);
  assert.equal(response.raw_output_contents.length, 2);
  const outputs = {};
  response.outputs.forEach((output, index) => {
    assert.equal(output.datatype, 'INT32');
    assert.deepEqual(output.shape.map(Number), [batch, 16]);
    outputs[output.name] = readInt32s(response.raw_output_contents[index]);
  });
  assert.deepEqual(outputs.OUTPUT0, sent.a.map((x, i) => (x + sent.b[i]) | 0));
  assert.deepEqual(outputs.OUTPUT1, sent.a.map((x, i) => (x - sent.b[i]) | 0));
  return {id: response.id, shape: [batch, 16], INPUT0: sent.a, INPUT1: sent.b, ...outputs};
}

function streamInfer(client, requests) {
  // Writes every request on one ModelStreamInfer call, ends the writing side, and collects every response
  // until the server ends the stream; resolves with the responses and the final status.
  return new Promise((resolve, reject) => {
    const call = client.ModelStreamInfer({deadline: deadline()});
    const responses = [];
    let status = null;
    let ended = false;
    const finish = () => {
      if (ended && status !== null) resolve({responses, status});
    };
    call.on('data', (response) => responses.push(response));
    call.on('error', reject);
    call.on('status', (s) => { status = s; finish(); });
    call.on('end', () => { ended = true; finish(); });
    for (const request of requests) call.write(request);
    call.end();
  });
}

async function main() {
  const address = process.argv[2];
  assert.ok(address, 'usage: node client.js HOST:PORT');
  const {inference} = load('grpc_service.proto');
  const management = load('management.proto').slotserve.management.v1;
  const credentials = grpc.credentials.createInsecure();
  const infer = new inference.GRPCInferenceService(address, credentials);
  const manage = new management.ModelManagement(address, credentials);
  const result = {};
  try {
    result.live = (await unary(infer, 'ServerLive', {})).live;
    assert.equal(result.live, true);

    const metadata = await unary(infer, 'ModelMetadata', {name: 'simple'});
    result.metadata = {
      name: metadata.name,
      versions: metadata.versions,
      inputs: metadata.inputs.map((t) => ({name: t.name, datatype: t.datatype, shape: t.shape.map(Number)})),
      outputs: metadata.outputs.map((t) => ({name: t.name, datatype: t.datatype, shape: t.shape.map(Number)})),
    };
    assert.equal(metadata.name, 'simple');

    const sent = simpleRequest('node-infer', 3);
    result.infer = checkSimpleResponse(await unary(infer, 'ModelInfer', sent.request), sent, 3);

    try {
      await unary(infer, 'ModelInfer', {...simpleRequest('node-unknown', 1).request, model_name: 'no_such_model'});
      assert.fail('ModelInfer on an unknown model succeeded');
    } catch (error) {
      if (error instanceof assert.AssertionError) throw error;
      assert.equal(error.code, grpc.status.NOT_FOUND, `code ${error.code}: ${error.details}`);
      result.unknown_model = {code: error.code, details: error.details};
    }

    // One stream: a success, a failing request (FP32 data for INT32 inputs), another success; then a clean end.
    const first = simpleRequest('node-stream-0', 1);
    const bad = simpleRequest('node-stream-bad', 1, 'FP32');
    const last = simpleRequest('node-stream-2', 2);
    const {responses, status} = await streamInfer(infer, [first.request, bad.request, last.request]);
    assert.equal(responses.length, 3, JSON.stringify(responses.map((r) => r.error_message)));
    assert.equal(status.code, grpc.status.OK, `stream ended with ${status.code}: ${status.details}`);
    assert.equal(responses[0].error_message, '');
    assert.notEqual(responses[1].error_message, '');
    assert.equal(responses[1].infer_response.id, 'node-stream-bad');
    assert.equal(responses[2].error_message, '');
    result.stream = {
      status: status.code,
      responses: [
        checkSimpleResponse(responses[0].infer_response, first, 1),
        {id: responses[1].infer_response.id, error_message: responses[1].error_message},
        checkSimpleResponse(responses[2].infer_response, last, 2),
      ],
    };

    // Management: reconfigure `simple` to one slot (the server runs with --parallel-jobs), infer, then list.
    const registered = await unary(manage, 'RegisterModel', {model_id: 'simple', slots: 1});
    assert.equal(registered.model_id, 'simple');
    assert.equal(registered.loaded, true);
    assert.equal(registered.state, 'MODEL_STATE_READY');
    assert.equal(registered.slots, 1);
    result.register = {model_id: registered.model_id, loaded: registered.loaded, state: registered.state,
                       slots: registered.slots, backend: registered.backend};
    const afterRegister = simpleRequest('node-after-register', 1);
    result.register.infer = checkSimpleResponse(await unary(infer, 'ModelInfer', afterRegister.request),
                                                afterRegister, 1);

    const listed = await unary(manage, 'ListModels', {});
    result.models = listed.models.map((m) => ({model_id: m.model_id, loaded: m.loaded, state: m.state,
                                               slots: m.slots}));
    const simple = result.models.find((m) => m.model_id === 'simple');
    assert.ok(simple && simple.loaded && simple.slots === 1, JSON.stringify(result.models));
  } finally {
    infer.close();
    manage.close();
  }
  console.log(JSON.stringify(result));
}

main().catch((error) => {
  console.error(error && error.stack ? error.stack : error);
  process.exitCode = 1;
});
