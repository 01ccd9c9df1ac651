'use strict'
// The real nydus-protocol 3.0.0 as an oracle for tests/codecs/test_nydus.py.
//
// Reads one JSON request per line on stdin and writes one JSON answer per line on stdout:
//   {"op": "decode", "input": "<string>"}
//     -> {"ok": true, "type": n[, "id": s][, "path": s][, "data": v]}   (no "data": none sent)
//     -> {"ok": false, "error": "PARSER_ERROR"} or {"ok": false, "error": "throws <name>"}
//   {"op": "encode", "type": n[, "data": v][, "id": s][, "path": s]}
//     -> {"ok": true, "output": "<string>"} or {"ok": false, "error": "throws <name>"}
// Numbers JSON cannot hold (1e400 parses to Infinity) are written as {"$nonfinite": "Infinity"}.
// Output is pure ASCII so that no line separator or encoding question can arise.

const path = require('path')
const readline = require('readline')
const protocol = require(path.join(__dirname, '..', 'interop', 'node_modules', 'nydus-protocol'))

function keepNonFinite(_key, value) {
  return typeof value === 'number' && !isFinite(value) ? { $nonfinite: String(value) } : value
}

function asciiJson(value) {
  return JSON.stringify(value, keepNonFinite).replace(
    /[\u007f-\uffff]/g,
    c => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'),
  )
}

function answer(request) {
  try {
    if (request.op === 'encode') {
      return { ok: true, output: protocol.encode(request.type, request.data, request.id, request.path) }
    }
    const message = protocol.decode(request.input)
    if (message.type === protocol.MessageType.ParserError) {
      return { ok: false, error: 'PARSER_ERROR' }
    }
    const out = { ok: true, type: message.type }
    for (const key of ['id', 'path', 'data']) {
      if (message[key] !== undefined) out[key] = message[key]
    }
    return out
  } catch (err) {
    return { ok: false, error: 'throws ' + err.name }
  }
}

readline.createInterface({ input: process.stdin, crlfDelay: Infinity }).on('line', line => {
  process.stdout.write(asciiJson(answer(JSON.parse(line))) + '\n')
})
