"""ModelKeySecret: a model provider's API key (Gemini, OpenAI) in Secrets Manager. Functions get its ARN, never its
value, in the environment."""

from __future__ import annotations

import re

from aws_cdk import aws_iam as iam
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from infra.constants import SECRET_READ_ACTIONS
from infra.constructs.memory_key import MemoryKey
from infra.constructs.nag import acknowledge

# Secrets Manager appends six random characters to a secret's name in its ARN.
_COMPLETE_ARN = re.compile(r'^arn:[^:]+:secretsmanager:[^:]*:\d*:secret:.+-[A-Za-z0-9]{6}$')
PLACEHOLDER = 'Set it with: aws secretsmanager put-secret-value --secret-id <{output}> --secret-string <key>'


class ModelKeySecret(Construct):
    """A new secret (encrypted with the stack's key) holding a placeholder the operator replaces, or an existing one
    imported by ARN or name (which keeps its own key: its key policy must let the functions' roles decrypt).

    Reading it is granted by `ModelAccess`, which also lets the reader decrypt with the stack's key when `created`.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        provider: str,
        key: MemoryKey,
        secret_arn: str | None = None,
        secret_name: str | None = None,
    ) -> None:
        """`provider` names the key's owner in the description and the output (`Gemini` → `GeminiSecretArn`)."""
        super().__init__(scope, construct_id)
        self.provider = provider
        self.created = not (secret_arn or secret_name)
        self.secret: secretsmanager.ISecret
        if secret_arn and _COMPLETE_ARN.match(secret_arn):
            self.secret = secretsmanager.Secret.from_secret_complete_arn(self, 'Imported', secret_arn)
        elif secret_arn:
            self.secret = secretsmanager.Secret.from_secret_partial_arn(self, 'Imported', secret_arn)
        elif secret_name:
            self.secret = secretsmanager.Secret.from_secret_name_v2(self, 'Imported', secret_name)
        else:
            self.secret = secretsmanager.Secret(
                self,
                'Secret',
                description=f'{provider} API key of the observational memory service. '
                + PLACEHOLDER.format(output=f'{provider}SecretArn'),
                # A random placeholder until the operator puts the real key: nothing secret is ever in the template.
                generate_secret_string=secretsmanager.SecretStringGenerator(exclude_punctuation=True),
                encryption_key=key.key,
            )
            acknowledge(
                self.secret,
                'SMG4',
                f'A third-party ({provider}) API key: a rotation Lambda cannot mint one. Rotate it with the provider '
                '(Google AI Studio, the OpenAI dashboard) and put the new value here; functions re-read it every '
                '5 minutes.',
            )

    @property
    def secret_arn(self) -> str:
        """The ARN the functions read the key by (OM_GEMINI_SECRET_ARN / OM_OPENAI_SECRET_ARN)."""
        return self.secret.secret_arn

    def grant_read(self, grantee: iam.IRole) -> None:
        """`secretsmanager:GetSecretValue` on this one secret only."""
        full_arn = self.secret.secret_full_arn
        # A secret known by name or partial ARN: match its random suffix (what CDK's own grant does).
        resource = full_arn if full_arn else f'{self.secret.secret_arn}-??????'
        iam.Grant.add_to_principal(grantee=grantee, actions=list(SECRET_READ_ACTIONS), resource_arns=[resource])
