import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventdrop.settings")
application = get_wsgi_application()

from kernel.db.plans import serve_pages  # noqa: E402

serve_pages()  # the console's pages and APIs: plans with the values (kernel/db/plans.py)
