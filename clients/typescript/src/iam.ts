/// <reference types="node" />
/**
 * IAM authentication (Node only): AWS Signature Version 4 for API Gateway (`execute-api`), with the AWS SDK v3
 * default credential chain (environment, shared config and SSO profiles, web identity, container and instance roles).
 *
 * ```ts
 * import { MemoryClient } from 'om-client';
 * import { iamAuth } from 'om-client/iam';
 *
 * const om = new MemoryClient({ apiUrl: 'https://abc123.execute-api.eu-west-1.amazonaws.com/prod', auth: iamAuth() });
 * ```
 *
 * Credentials are asked of the chain per request (it caches and refreshes them), so refreshed role credentials are
 * used as soon as they are issued.
 */
import { defaultProvider } from '@aws-sdk/credential-provider-node';
import { Hash } from '@smithy/hash-node';
import { SignatureV4 } from '@smithy/signature-v4';
import type { AwsCredentialIdentity, AwsCredentialIdentityProvider } from '@smithy/types';
import type { Auth } from './auth.js';

// https://{api-id}.execute-api.{region}.amazonaws.com[.cn] (and the vpce- form {api-id}-{vpce-id}.execute-api...)
const EXECUTE_API_HOST = /\.execute-api\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?$/;

/** The AWS region in an `execute-api` URL, or undefined (custom domains, loopback). */
export function regionFromUrl(url: string): string | undefined {
  return EXECUTE_API_HOST.exec(new URL(url).hostname)?.[1];
}

export interface IamAuthOptions {
  /** The API's region. Default: from an `execute-api` URL, else `AWS_REGION` / `AWS_DEFAULT_REGION`. */
  region?: string;
  /** Fixed credentials or a provider (default: the AWS SDK's default credential chain). */
  credentials?: AwsCredentialIdentity | AwsCredentialIdentityProvider;
  /** The signing name (`execute-api` for API Gateway). */
  service?: string;
}

/** Split a query string as sent (already percent-encoded, RFC 3986) into the decoded values the signer re-encodes. */
function queryOf(search: string): Record<string, string | string[]> {
  const query: Record<string, string | string[]> = {};
  for (const pair of search.replace(/^\?/, '').split('&')) {
    if (!pair) continue;
    const [rawKey = '', rawValue = ''] = pair.split(/=(.*)/s, 2);
    const key = decodeURIComponent(rawKey);
    const value = decodeURIComponent(rawValue);
    const seen = query[key];
    query[key] = seen === undefined ? value : [...(Array.isArray(seen) ? seen : [seen]), value];
  }
  return query;
}

/** SigV4 for `execute-api`: signs the host, the content type, the body and the path and query exactly as sent. */
export function iamAuth(options: IamAuthOptions = {}): Auth {
  const service = options.service ?? 'execute-api';
  const credentials = options.credentials ?? defaultProvider();
  const signers = new Map<string, SignatureV4>();

  const signerFor = (url: string): SignatureV4 => {
    const region = options.region ?? regionFromUrl(url) ?? process.env.AWS_REGION ?? process.env.AWS_DEFAULT_REGION;
    if (!region) {
      throw new TypeError(
        'the AWS region of the API is unknown: pass iamAuth({ region }) or set AWS_REGION ' +
          '(it is read from execute-api URLs automatically)',
      );
    }
    let signer = signers.get(region);
    if (!signer) {
      signer = new SignatureV4({
        service,
        region,
        credentials,
        sha256: Hash.bind(null, 'sha256'),
        applyChecksum: false,
      });
      signers.set(region, signer);
    }
    return signer;
  };

  return {
    async authorize(request) {
      const url = new URL(request.url);
      const body = request.body ? new Uint8Array(await request.clone().arrayBuffer()) : undefined;
      // Sign only what is sent and cannot change on the way: the host, the content type and the body.
      const headers: Record<string, string> = { host: url.host };
      const contentType = request.headers.get('content-type');
      if (contentType) headers['content-type'] = contentType;
      const signed = await signerFor(request.url).sign({
        method: request.method,
        protocol: url.protocol,
        hostname: url.hostname,
        ...(url.port ? { port: Number(url.port) } : {}),
        path: url.pathname,
        query: queryOf(url.search),
        headers,
        body,
      });
      const sent = new Headers(request.headers);
      for (const [name, value] of Object.entries(signed.headers)) {
        if (name.toLowerCase() !== 'host') sent.set(name, value);
      }
      return new Request(request, { headers: sent });
    },
  };
}
