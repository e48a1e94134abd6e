"""Acknowledging a cdk-nag (AwsSolutions) finding, always with the reason written next to the code it is about."""

from __future__ import annotations

from aws_cdk import Acknowledgment, CfnResource, Stack, Validations
from constructs import IConstruct

PACK = 'AwsSolutions'


def acknowledge(scope: IConstruct, rule: str, reason: str, *, finding: str | None = None) -> None:
    """Acknowledge `rule` (e.g. `L1`) on `scope` and its children; `finding` narrows it (e.g. `Resource::*`)."""
    rule_id = f'{PACK}::{PACK}-{rule}' + (f'[{finding}]' if finding else '')
    Validations.of(scope).acknowledge(Acknowledgment(id=rule_id, reason=reason))


def logical_id(resource: IConstruct) -> str:
    """The resolved CloudFormation logical id of an L2's resource, as cdk-nag writes it in finding ids."""
    cfn = resource if isinstance(resource, CfnResource) else resource.node.default_child
    assert isinstance(cfn, CfnResource), resource.node.path
    stack = Stack.of(cfn)
    return str(stack.resolve(stack.get_logical_id(cfn)))


def nag_text(scope: IConstruct, value: str) -> str:
    """`value` as cdk-nag writes it in a finding id: tokens resolved, pseudo parameters as `<AWS::Partition>` etc."""
    import json

    resolved = Stack.of(scope).resolve(value)
    if isinstance(resolved, str):
        return resolved
    # Fn::Join of literals and Refs to pseudo parameters (what an ARN built from Aws.PARTITION ... becomes).
    parts = resolved.get('Fn::Join', [None, []])[1] if isinstance(resolved, dict) else []
    text = ''
    for part in parts:
        if isinstance(part, str):
            text += part
        elif isinstance(part, dict) and 'Ref' in part:
            text += f'<{part["Ref"]}>'
        else:
            text += json.dumps(part)
    return text
