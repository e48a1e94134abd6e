/**
 * Authentication: none, a bearer token (JWT/Cognito), or IAM (SigV4, from `om-client/iam`, Node only).
 *
 * ```ts
 * new MemoryClient({ apiUrl });                                   // none: the local stack, or a stack without auth
 * new MemoryClient({ apiUrl, auth: bearerAuth(token) });          // a string...
 * new MemoryClient({ apiUrl, auth: bearerAuth(() => getToken()) }); // ...or an (async) function asked per request
 * new MemoryClient({ apiUrl, auth: iamAuth() });                  // import { iamAuth } from 'om-client/iam'
 * ```
 */

/** Adds credentials to a request. */
export interface Auth {
  /** The request to send: `request` with its credentials (may be `request` itself, or a new Request). */
  authorize(request: Request): Promise<Request>;
  /** Called after a 401: true when fresh credentials are available and the request should be sent once more. */
  refresh?(): boolean | Promise<boolean>;
}

/** No credentials (the local stack; a deployment without an authorizer). */
export const noAuth: Auth = {
  async authorize(request) {
    return request;
  },
};

/** A token, or a function that returns one (sync or async). */
export type TokenSource = string | (() => string | Promise<string>);

/**
 * `Authorization: Bearer <token>`. With a function, the token is asked for before every request (cache inside it if
 * minting is costly), and once more after a 401, which is retried with the new token.
 */
export function bearerAuth(token: TokenSource): Auth {
  if (typeof token === 'string' && !token.trim()) {
    throw new TypeError('the bearer token is empty: pass the token (a JWT) or a function that returns one');
  }
  const current = async (): Promise<string> => {
    const value = typeof token === 'function' ? await token() : token;
    if (typeof value !== 'string' || !value.trim()) throw new TypeError('the bearer token function returned no token');
    return value.trim();
  };
  return {
    async authorize(request) {
      const headers = new Headers(request.headers);
      headers.set('authorization', `Bearer ${await current()}`);
      return new Request(request, { headers });
    },
    refresh: () => typeof token === 'function',
  };
}
