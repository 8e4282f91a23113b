"""joblib and scikit-learn on fiberlite: after fiberlite.joblib.register(), the backend
"fiberlite" runs joblib.Parallel, and every n_jobs of scikit-learn, on fiberlite workers."""
import joblib
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV

import fiberlite.joblib


def slow_square(x):
    return x * x


if __name__ == "__main__":
    fiberlite.joblib.register()
    with joblib.parallel_config(backend="fiberlite", n_jobs=2):
        print("squares:", joblib.Parallel()(joblib.delayed(slow_square)(i) for i in range(8)))
        X, y = make_classification(n_samples=200, n_features=8, random_state=0)
        grid = {"C": [0.01, 0.1, 1.0, 10.0]}
        search = GridSearchCV(LogisticRegression(), grid, cv=3).fit(X, y)  # 12 fits on the workers
    serial = GridSearchCV(LogisticRegression(), grid, cv=3, n_jobs=1).fit(X, y)
    same = list(search.cv_results_["mean_test_score"]) == list(serial.cv_results_["mean_test_score"])
    print("best C:", search.best_params_["C"], f"score {search.best_score_:.3f},",
          "the scores of n_jobs=1:", same)
