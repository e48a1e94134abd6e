"""ApiFirewall: a WAFv2 web ACL in front of the API stage.

Rules, in order:

1. `BodyOverLimit`: a declared body (Content-Length) over the API's own limit is refused with 413 before API Gateway
   invokes anything. WAF inspects at most the first 16 KB of a body, so the limit is read from the header; a request
   without one still meets API Gateway's 10 MB limit and the API function's check.
2. `PerIpRate`: more than `rate_limit` requests from one IP in 5 minutes are refused with 429 until the rate drops.
3. AWS's known-bad-inputs rule group (exploit paths, Log4j and Java deserialisation payloads, bad Host headers).
4. AWS's common rule group (the OWASP-style checks on URI, query string, headers and cookies).

The two managed groups' rules that read the request *body* count instead of block (unless `block_body_rules`): the
bodies are conversations for a language model, which legitimately hold code, HTML, file paths, URLs and base64 images
(the common group would also refuse any body over 8 KB). Nothing in a body is executed, rendered or used as a path by
the service; the matches still show in WAF's metrics and sampled requests.
"""

from __future__ import annotations

import json

from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_wafv2 as wafv2
from constructs import Construct

_BODY_RULES = {
    'AWSManagedRulesCommonRuleSet': (
        'SizeRestrictions_BODY',
        'EC2MetaDataSSRF_BODY',
        'GenericLFI_BODY',
        'GenericRFI_BODY',
        'CrossSiteScripting_BODY',
    ),
    'AWSManagedRulesKnownBadInputsRuleSet': ('JavaDeserializationRCE_BODY', 'Log4JRCE_BODY'),
}


def decimal_greater_than(limit: int) -> str:
    """A regular expression matching exactly the decimal integers greater than `limit` (leading zeros allowed).

    WAF cannot compare numbers, so "Content-Length > limit" is a pattern: every longer number, and for each digit of
    `limit` the numbers that share its prefix and are larger at that digit.
    """
    if limit < 0:
        raise ValueError(f'limit must be >= 0, got {limit}')
    digits = str(limit)
    longer = f'[1-9][0-9]{{{len(digits)},}}'
    same_length = []
    for i, digit in enumerate(digits):
        if digit == '9':
            continue
        low = int(digit) + 1
        rest = len(digits) - i - 1
        tail = f'[0-9]{{{rest}}}' if rest else ''
        head = digits[:i]
        # The first digit of a same-length number cannot be 0 (that would be a shorter number).
        same_length.append(f'{head}[{low}-9]{tail}')
    return '^0*(?:' + '|'.join([longer, *same_length]) + ')$'


def _error_body(code: str, message: str) -> str:
    return json.dumps({'error': {'code': code, 'message': message, 'details': []}}, separators=(',', ':'))


class ApiFirewall(Construct):
    """The web ACL (REGIONAL) and its association with `stage`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        stage: apigw.Stage,
        rate_limit: int,
        max_body_bytes: int,
        block_body_rules: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        self.max_body_bytes = max_body_bytes
        self.rate_limit = rate_limit
        rules = [
            self._body_limit_rule(priority=0),
            self._rate_rule(priority=1),
            self._managed_group('AWSManagedRulesKnownBadInputsRuleSet', priority=2, block_body=block_body_rules),
            self._managed_group('AWSManagedRulesCommonRuleSet', priority=3, block_body=block_body_rules),
        ]
        self.web_acl = wafv2.CfnWebACL(
            self,
            'WebAcl',
            scope='REGIONAL',
            description='Observational memory API: body limit, per-IP rate, AWS managed common and known-bad-inputs',
            default_action=wafv2.CfnWebACL.DefaultActionProperty(allow={}),
            visibility_config=self._visibility('WebAcl'),
            custom_response_bodies={
                'PayloadTooLarge': wafv2.CfnWebACL.CustomResponseBodyProperty(
                    content_type='APPLICATION_JSON',
                    content=_error_body(
                        'payload_too_large',
                        f'the request body is over {max_body_bytes} bytes; upload files via /attachments',
                    ),
                ),
                'TooManyRequests': wafv2.CfnWebACL.CustomResponseBodyProperty(
                    content_type='APPLICATION_JSON',
                    content=_error_body('too_many_requests', 'too many requests from this address; retry later'),
                ),
            },
            rules=rules,
        )
        self.association = wafv2.CfnWebACLAssociation(
            self, 'Association', resource_arn=stage.stage_arn, web_acl_arn=self.web_acl.attr_arn
        )

    @staticmethod
    def _visibility(name: str) -> wafv2.CfnWebACL.VisibilityConfigProperty:
        return wafv2.CfnWebACL.VisibilityConfigProperty(
            cloud_watch_metrics_enabled=True, metric_name=f'OmApi{name}', sampled_requests_enabled=True
        )

    def _blocking_rule(
        self, name: str, *, priority: int, status: int, body_key: str, statement: wafv2.CfnWebACL.StatementProperty
    ) -> wafv2.CfnWebACL.RuleProperty:
        """A rule that answers a match with `status` and the custom response body `body_key`."""
        return wafv2.CfnWebACL.RuleProperty(
            name=name,
            priority=priority,
            action=wafv2.CfnWebACL.RuleActionProperty(
                block=wafv2.CfnWebACL.BlockActionProperty(
                    custom_response=wafv2.CfnWebACL.CustomResponseProperty(
                        response_code=status, custom_response_body_key=body_key
                    )
                )
            ),
            statement=statement,
            visibility_config=self._visibility(name),
        )

    def _body_limit_rule(self, *, priority: int) -> wafv2.CfnWebACL.RuleProperty:
        return self._blocking_rule(
            'BodyOverLimit',
            priority=priority,
            status=413,
            body_key='PayloadTooLarge',
            statement=wafv2.CfnWebACL.StatementProperty(
                regex_match_statement=wafv2.CfnWebACL.RegexMatchStatementProperty(
                    regex_string=decimal_greater_than(self.max_body_bytes),
                    field_to_match=wafv2.CfnWebACL.FieldToMatchProperty(single_header={'Name': 'content-length'}),
                    text_transformations=[wafv2.CfnWebACL.TextTransformationProperty(priority=0, type='NONE')],
                )
            ),
        )

    def _rate_rule(self, *, priority: int) -> wafv2.CfnWebACL.RuleProperty:
        return self._blocking_rule(
            'PerIpRate',
            priority=priority,
            status=429,
            body_key='TooManyRequests',
            statement=wafv2.CfnWebACL.StatementProperty(
                rate_based_statement=wafv2.CfnWebACL.RateBasedStatementProperty(
                    limit=self.rate_limit, aggregate_key_type='IP', evaluation_window_sec=300
                )
            ),
        )

    def _managed_group(self, name: str, *, priority: int, block_body: bool) -> wafv2.CfnWebACL.RuleProperty:
        overrides = (
            []
            if block_body
            else [
                wafv2.CfnWebACL.RuleActionOverrideProperty(
                    name=rule, action_to_use=wafv2.CfnWebACL.RuleActionProperty(count={})
                )
                for rule in _BODY_RULES[name]
            ]
        )
        return wafv2.CfnWebACL.RuleProperty(
            name=name,
            priority=priority,
            override_action=wafv2.CfnWebACL.OverrideActionProperty(none={}),
            statement=wafv2.CfnWebACL.StatementProperty(
                managed_rule_group_statement=wafv2.CfnWebACL.ManagedRuleGroupStatementProperty(
                    vendor_name='AWS', name=name, rule_action_overrides=overrides or None
                )
            ),
            visibility_config=self._visibility(name),
        )
