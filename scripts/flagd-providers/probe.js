// Builds the flagd provider of @openfeature/flagd-provider (npm) as an app does, from its environment only,
// and prints as JSON what it resolved to: the resolver, and the gRPC client it built (target, TLS, the CA it
// read, the TLS server name grpc-js will send and verify). Read from the provider's own objects; nothing
// connects (grpc-js channels connect on first use).
'use strict';
const fs = require('node:fs');
const { FlagdProvider } = require('@openfeature/flagd-provider');

// Which CA file the provider reads (it reads FLAGD_SERVER_CERT_PATH itself when TLS is on).
const read = [];
const realRead = fs.readFileSync;
fs.readFileSync = function (path, ...rest) {
  read.push(String(path));
  return realRead.call(fs, path, ...rest);
};

const provider = new FlagdProvider();
const service = provider._service;
const inProcess = service.constructor.name === 'InProcessService';
const client = inProcess ? service._dataFetcher._syncClient : service._client;
const channel = client.getChannel();
const target = channel.getTarget();
const internal = channel.internalChannel;
const secure = internal.credentials._isSecure();
let servername = null;
if (secure) {
  const connector = internal.credentials._createSecureConnector(internal.target, internal.options);
  servername = connector.connectionOptions.servername;
}
let host = null;
let port = null;
let socket = null;
if (target.startsWith('unix://')) {
  socket = target.slice('unix://'.length);
} else {
  const hostPort = target.replace(/^dns:/, '');
  const at = hostPort.lastIndexOf(':');
  host = hostPort.slice(0, at);
  port = Number(hostPort.slice(at + 1));
}
const ca = read.filter((p) => p === process.env.FLAGD_SERVER_CERT_PATH);
console.log(JSON.stringify({
  resolver: inProcess ? 'in-process' : 'rpc',
  host,
  port,
  socket,
  tls: secure,
  ca: ca.length ? ca[0] : null,
  servername,
  authority: internal.options['grpc.default_authority'] ?? null,
  target,
  // What the sync stream asks for (in-process), or the header RPC calls carry.
  selector: inProcess
    ? service._dataFetcher._request.selector
    : (service._metadata.get('flagd-selector')[0] ?? ''),
}));
