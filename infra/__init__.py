"""The CDK app that deploys the service (CONTRACT §4). Entry point: infra/app.py."""
