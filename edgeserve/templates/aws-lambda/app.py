"""AWS Lambda entry of an edgeserve function: the handler string is `app.handler`.

Importing this module is Lambda's init phase: the model loads and warms up here, once per
execution environment, never per invocation.
"""

from edgeserve.aws_lambda.adapter import create_handler

handler = create_handler()
