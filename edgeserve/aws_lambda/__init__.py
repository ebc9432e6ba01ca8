"""Everything AWS Lambda, in one package; boto3 and mangum load only inside the modules using them.

adapter.py      the handler Lambda runs: the bundle's runtime behind Mangum, built once
incoming.py     what arrives, sorted before Mangum: malformed HTTP events, direct v2 calls
settings.py     the target profile's [settings] and Lambda's limits
package.py      zip (manylinux wheels) or image build context, the same task root
sam.py          a SAM template for the packaged function
driver.py       deploy, status, rollback with boto3 (the `aws-lambda` driver)
s3.py           a zip too large to send inline, uploaded to S3 first
translate.py    botocore's exceptions -> DeployError (the step, and a hint)
preflight.py    before deploy uploads: the bundle answers ready as Lambda runs it (emulated)
emulator.py     `serve --emulate aws-lambda`: the front that turns HTTP into Lambda events
events.py       HTTP request <-> Lambda event translation (pure)
environment.py  one emulated execution environment (the real awslambdaric in a process)
runtime_api.py  the Lambda Runtime API the environment's client talks to
"""
